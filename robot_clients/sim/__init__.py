"""Simulated robots for the control loop: a MuJoCo arm (``mujoco_arm``), an Isaac Lab adapter
(``isaac_adapter``), and the closed-loop demo (``demo``). Nothing here is imported by ``robot_clients``
itself; mujoco, imageio and pillow are imported only by the modules that need them, when they run."""
