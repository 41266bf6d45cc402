# The two commands of the README. Each creates .venv when missing and installs into it.
# torch is installed first and exactly: `torch==2.13.0` resolves to the CPU build on this
# kind of machine, where a looser requirement pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# openpi-client 0.1.2 pins numpy<2 (this project uses numpy 2): the compatibility tests run the real
# package from its own virtual environment, in a subprocess.
OPENPI_VENV := .venv-openpi
OPENPI_STAMP := $(OPENPI_VENV)/.installed
# Recordings are checked with LeRobot's own reader (lerobot-dataset, imported as `ledataset`) from its own
# virtual environment. It imports torch, torchvision and torchcodec without declaring them: the CPU torch,
# the torchvision of that torch, and torchcodec 0.13.0, the CPU build for torch 2.13, which decodes with
# the system's FFmpeg libraries. Never `lerobot` itself: it pins an older torch and pulls a CUDA build.
LEROBOT_VENV := .venv-lerobot
LEROBOT_STAMP := $(LEROBOT_VENV)/.installed
# vla-eval's own orchestrator (allenai/vla-evaluation-harness, PyPI, pulls no torch) scores the server from its
# own virtual environment, with mujoco and this package's light robot_clients for the MuJoCo arm benchmark.
VLAEVAL_VENV := .venv-vlaeval
VLAEVAL_STAMP := $(VLAEVAL_VENV)/.installed
# Third-party simulators driven through robot_clients.sim.gym_bridge, each unchanged in a virtual environment of
# its own with the light robot_clients installed there: MetaWorld 3.1.1 pins mujoco==3.3.0 (this project's
# environment has 4.0.0) and uses `packaging` without declaring it; gym-pusht (pymunk) is Push-T.
METAWORLD_VENV := .venv-metaworld
METAWORLD_STAMP := $(METAWORLD_VENV)/.installed
PUSHT_VENV := .venv-pusht
PUSHT_STAMP := $(PUSHT_VENV)/.installed
FFMPEG_LIBRARIES := libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
# Headless OpenGL for MuJoCo's offscreen rendering: EGL on Mesa's software rasterizer (no GPU, no display).
GL_PACKAGES := libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri
# The dashboard test drives Debian's Chromium (never a browser a tool downloads itself).
BROWSER_PACKAGES := chromium
# The shaped-link test and benchmark (benchmarks/netns_link.py): `ip netns`, veth pairs and `tc netem`.
NET_PACKAGES := iproute2


.PHONY: lint demo reach-policy moving-policy drawer-policy test test-slow install clean system-deps test-system-deps net-system-deps bench-gpu bench-gpu-smoke gpu-wheels

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[server,sim,dev,ray]'
	touch $(STAMP)

$(OPENPI_STAMP):
	test -x $(OPENPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENPI_VENV)
	$(OPENPI_VENV)/bin/python -m pip install --quiet openpi-client==0.1.2 typing_extensions
	touch $(OPENPI_STAMP)

$(LEROBOT_STAMP):
	test -x $(LEROBOT_VENV)/bin/python || $(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LEROBOT_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(LEROBOT_VENV)/bin/python -m pip install --quiet torchvision==0.28.0 torchcodec==0.13.0 lerobot-dataset==0.4.4
	touch $(LEROBOT_STAMP)

# Each: this package (its base install is the light robot_clients: numpy, msgpack, websockets), editable, with
# the extra of the same name (pyproject.toml pins them).
$(VLAEVAL_STAMP): pyproject.toml
	test -x $(VLAEVAL_VENV)/bin/python || $(PYTHON) -m venv $(VLAEVAL_VENV)
	$(VLAEVAL_VENV)/bin/python -m pip install --quiet -e '.[vla-eval]'
	touch $(VLAEVAL_STAMP)

$(METAWORLD_STAMP): pyproject.toml
	test -x $(METAWORLD_VENV)/bin/python || $(PYTHON) -m venv $(METAWORLD_VENV)
	$(METAWORLD_VENV)/bin/python -m pip install --quiet -e '.[metaworld]'
	touch $(METAWORLD_STAMP)

$(PUSHT_STAMP): pyproject.toml
	test -x $(PUSHT_VENV)/bin/python || $(PYTHON) -m venv $(PUSHT_VENV)
	$(PUSHT_VENV)/bin/python -m pip install --quiet -e '.[pusht]'
	touch $(PUSHT_STAMP)

# Installs Debian packages only when one is missing (apt needs root; elsewhere it says what to install).
define apt_ensure
	@if command -v dpkg >/dev/null 2>&1 && ! dpkg -s $(1) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(1); \
		else \
			echo "please install: sudo apt-get install $(1)" >&2; exit 1; \
		fi; \
	fi
endef

system-deps:
	$(call apt_ensure,$(GL_PACKAGES))

test-system-deps:
	$(call apt_ensure,$(GL_PACKAGES) $(BROWSER_PACKAGES) $(FFMPEG_LIBRARIES) $(NET_PACKAGES))

net-system-deps:
	$(call apt_ensure,$(NET_PACKAGES))

install: $(STAMP) system-deps

# The demo serves the shipped reach policy (assets/reach_policy), runs its episodes and prints their success;
# it records its session (--record-dir) and LeRobot's own LeRobotDataset then loads the episode.
demo: $(STAMP) $(LEROBOT_STAMP) system-deps
	rm -rf demo-output/recordings
	$(VENV)/bin/cosmos3-demo-mujoco --record-dir demo-output/recordings
	$(LEROBOT_VENV)/bin/python tests/lerobot_dataset_script.py --out demo-output/lerobot-read.npz demo-output/recordings/2*

# The reach policy from nothing: scripted demonstrations (a LeRobot dataset; 16 ticks each, so most frames
# are of the reach itself, where only the camera tells the goal, not of the arm holding still), then
# cosmos3-train on them (a tiny Cosmos3 drawn here, width 128, 2 CPU threads), then the checkpoint is copied to assets/reach_policy (the one the
# demo serves) without its optimizer state. docs/training.md has the figures.
REACH_TRAIN_STEPS ?= 6000
reach-policy: $(STAMP) system-deps
	rm -rf build/reach-demos build/reach-policy
	$(VENV)/bin/cosmos3-reach-demos build/reach-demos --episodes 350 --episode-steps 16 --seed 1000
	$(VENV)/bin/cosmos3-train build/reach-demos --out build/reach-policy --hidden-size 128 \
		--steps $(REACH_TRAIN_STEPS) --ema-decay 0.998 --prefix-noise 0.2 --threads 2
	rm -rf assets/reach_policy
	cp -r build/reach-policy assets/reach_policy
	rm -f assets/reach_policy/training_state.pt assets/reach_policy/training_latents.pt

# The moving-cube policy from nothing, in four stages. First the moving task's scripted expert (40-tick
# episodes, the camera a two-frame clip), then cosmos3-train with prefixes up to 12 rows (rtc at 500 ms of
# delay asks about 14: the profile's max_prefix clamps them) and the rows past an episode's end left out of
# the loss (the cube does not stop when the recording does): the first moving policy. Then DAgger: half the
# episodes driven by a student that plans late, misjudges the cube's speed and jitters, every frame labelled
# with the expert's chunk for the state it is in (--chunk-labels --perturbed 0.5), and the first policy
# fine-tuned on them. Then 32-row chunks, so that a chunk outlasts 500 ms of delay (a 16-row one taken over
# at its row 12 runs out before the next comes): DAgger labels of 32 rows with students' prefixes up to 16
# rows, two rounds on fresh paths, fine-tuned from the 16-row policy; the runs were stopped and resumed with
# more steps and new loss settings as the per-row errors were read (benchmarks/moving_chunk_rows.py), and
# the resumed commands below repeat that. Last, DAgger on the policy's own rollouts: two rounds in which
# the latest policy, served here, drives a share of the episodes as rtc runs its chunks at a latency drawn
# per episode, and the expert labels its states and the very prefixes it was sent (--rollout-model).
# Those four stages read a camera clip whose frames are 8 ticks apart (--clip-stride 8). Stage 5 moves to
# the task's clip of 16 ticks, from which the cube's speed reads twice as sharply: a fine-tune on expert and
# student episodes, then one round of rollouts of that policy.
# The checkpoint is copied to assets/moving_policy without its optimizer state. docs/training.md ("The
# moving-cube task") has the figures.
MOVING_TRAIN_STEPS ?= 6000
MOVING_DAGGER_STEPS ?= 1800
MOVING_32 = --domain cosmos3_mujoco_arm_moving --horizon 32 --lr 1e-3 --ema-decay 0.998 --prefix-noise 0.3 \
	--max-prefix 16 --threads 2
MOVING_32_DEMOS = --task moving --chunk-labels --perturbed 0.5 --student-prefixes 0.5 --max-prefix 16 --horizon 32
MOVING_STRIDE_8 = --clip-stride 8
moving-policy: $(STAMP) system-deps
	rm -rf build/moving-demos build/moving-policy build/moving-dagger-demos build/moving-dagger-policy
	rm -rf build/moving-32-demos build/moving-32-policy build/moving-32-demos-2 build/moving-32-policy-2
	rm -rf build/moving-rollout-demos build/moving-rollout-policy build/moving-rollout-demos-2 build/moving-rollout-policy-2
	rm -rf build/moving-stride16-demos build/moving-stride16-policy build/moving-stride16-demos-2 build/moving-stride16-policy-2
	$(VENV)/bin/cosmos3-reach-demos build/moving-demos --task moving --episodes 250 --seed 1000 $(MOVING_STRIDE_8)
	$(VENV)/bin/cosmos3-train build/moving-demos --out build/moving-policy --domain cosmos3_mujoco_arm_moving \
		--hidden-size 128 --steps $(MOVING_TRAIN_STEPS) --ema-decay 0.998 --prefix-noise 0.2 --max-prefix 12 \
		--mask-padding --threads 2
	rm -f build/moving-policy/training_state.pt build/moving-policy/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-dagger-demos --task moving --episodes 300 --seed 1000 \
		--chunk-labels --perturbed 0.5 $(MOVING_STRIDE_8)
	$(VENV)/bin/cosmos3-train build/moving-dagger-demos --out build/moving-dagger-policy --base build/moving-policy \
		--domain cosmos3_mujoco_arm_moving --steps $(MOVING_DAGGER_STEPS) --lr 1e-3 --ema-decay 0.998 \
		--prefix-noise 0.3 --max-prefix 12 --threads 2
	$(VENV)/bin/cosmos3-reach-demos build/moving-32-demos --episodes 300 --seed 5000 $(MOVING_32_DEMOS) $(MOVING_STRIDE_8)
	$(VENV)/bin/cosmos3-train build/moving-32-demos --out build/moving-32-policy --base build/moving-dagger-policy \
		$(MOVING_32) --steps 3000
	$(VENV)/bin/cosmos3-train build/moving-32-demos --out build/moving-32-policy --base build/moving-dagger-policy \
		$(MOVING_32) --steps 7000 --action-weight 2 --resume
	rm -f build/moving-32-policy/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-32-demos-2 --episodes 400 --seed 6000 $(MOVING_32_DEMOS) $(MOVING_STRIDE_8)
	$(VENV)/bin/cosmos3-train build/moving-32-demos-2 --out build/moving-32-policy-2 --base build/moving-32-policy \
		$(MOVING_32) --steps 4000 --action-weight 2
	$(VENV)/bin/cosmos3-train build/moving-32-demos-2 --out build/moving-32-policy-2 --base build/moving-32-policy \
		$(MOVING_32) --steps 7000 --action-weight 2 --prefix-prob 0.2 --resume
	$(VENV)/bin/cosmos3-train build/moving-32-demos-2 --out build/moving-32-policy-2 --base build/moving-32-policy \
		$(MOVING_32) --steps 10000 --action-weight 2 --prefix-prob 0.2 --resume
	rm -f build/moving-32-policy-2/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-rollout-demos --episodes 400 --seed 7000 $(MOVING_32_DEMOS) $(MOVING_STRIDE_8) \
		--rollout-model build/moving-32-policy-2 --rollout-share 0.5
	$(VENV)/bin/cosmos3-train build/moving-rollout-demos --out build/moving-rollout-policy \
		--base build/moving-32-policy-2 $(MOVING_32) --steps 4000 --action-weight 2 --prefix-prob 0.2
	rm -f build/moving-rollout-policy/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-rollout-demos-2 --episodes 400 --seed 8000 $(MOVING_32_DEMOS) $(MOVING_STRIDE_8) \
		--rollout-model build/moving-rollout-policy --rollout-share 0.75
	$(VENV)/bin/cosmos3-train build/moving-rollout-demos-2 --out build/moving-rollout-policy-2 \
		--base build/moving-rollout-policy $(MOVING_32) --steps 4000 --action-weight 2 --prefix-prob 0.2
	rm -f build/moving-rollout-policy-2/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-stride16-demos --episodes 400 --seed 10000 $(MOVING_32_DEMOS)
	$(VENV)/bin/cosmos3-train build/moving-stride16-demos --out build/moving-stride16-policy \
		--base build/moving-rollout-policy-2 $(MOVING_32) --steps 4000 --action-weight 2 --prefix-prob 0.2
	rm -f build/moving-stride16-policy/training_latents.pt
	$(VENV)/bin/cosmos3-reach-demos build/moving-stride16-demos-2 --episodes 400 --seed 11000 $(MOVING_32_DEMOS) \
		--rollout-model build/moving-stride16-policy --rollout-share 0.75
	$(VENV)/bin/cosmos3-train build/moving-stride16-demos-2 --out build/moving-stride16-policy-2 \
		--base build/moving-stride16-policy $(MOVING_32) --steps 4000 --action-weight 2 --prefix-prob 0.2
	rm -rf assets/moving_policy
	cp -r build/moving-stride16-policy-2 assets/moving_policy
	rm -f assets/moving_policy/training_state.pt assets/moving_policy/training_latents.pt

# A MetaWorld policy from nothing: MetaWorld's own scripted drawer-close policy, run through the gym bridge
# in .venv-metaworld, recorded as a LeRobot dataset (the drawer's place only in the camera), then
# cosmos3-train. `benchmarks/third_party_sims.py --model build/drawer-policy` measures it (docs/training.md).
DRAWER_TRAIN_STEPS ?= 3000
drawer-policy: $(STAMP) $(METAWORLD_STAMP) system-deps
	rm -rf build/drawer-demos build/drawer-policy
	MUJOCO_GL=egl $(VENV)/bin/cosmos3-gym-demos build/drawer-demos --preset metaworld-drawer-close \
		--python $(METAWORLD_VENV)/bin/python --episodes 100 --seed 1000
	$(VENV)/bin/cosmos3-train build/drawer-demos --out build/drawer-policy --domain metaworld_drawer_close \
		--hidden-size 128 --steps $(DRAWER_TRAIN_STEPS) --threads 2

# The rules tools hold: ruff's format and lint at 120 columns, mypy --strict over the rooms pyproject.toml names.
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy

# Two pytest-xdist workers, a test file to each at a time (its module fixtures, a server or a Ray cluster,
# stay in one process): most tests wait on a server, a socket or a timeout as often as they compute, so two
# workers on two cores take about 0.6 times as long as one (600 s against 1022 s measured), and every test
# holds its margins with the other core busy, as it must. PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
test: lint $(STAMP) $(OPENPI_STAMP) $(LEROBOT_STAMP) $(VLAEVAL_STAMP) $(METAWORLD_STAMP) $(PUSHT_STAMP) test-system-deps
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The slow tests need what `make test` installs for them: EGL for MuJoCo (the reach policy), iproute2 (the link).
test-slow: $(STAMP) test-system-deps
	$(PY) -m pytest -q -m slow

# The GPU suite (docs/benchmarks.md, "GPU"). `make bench-gpu` runs on a CUDA machine with the machine's
# own python3 and CUDA torch, which it never replaces: it first checks that torch sees a GPU (and stops,
# installing nothing, where none is), then installs what benchmarks/gpu_requirements.txt lists with
# --no-deps into $(GPU_SITE) (put first on PYTHONPATH), from $(GPU_WHEELS)/ when that folder holds wheels
# (a machine without network: `make gpu-wheels` fills it on one with network), else from PyPI.
GPU_PYTHON ?= python3
GPU_SITE := .gpu-site
GPU_WHEELS := .whl
BENCH_OUT ?= bench-gpu-results
GPU_PIP_SOURCE = $(if $(wildcard $(GPU_WHEELS)/*.whl),--no-index --find-links $(GPU_WHEELS),)

bench-gpu:
	@$(GPU_PYTHON) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || { \
		echo "make bench-gpu: no CUDA GPU seen by $(GPU_PYTHON)'s torch here; nothing installed." >&2; \
		echo "  On a CPU machine, make bench-gpu-smoke checks the suite end to end on tiny checkpoints." >&2; \
		exit 2; }
	$(GPU_PYTHON) -m pip install --quiet --no-deps --no-compile --upgrade --target $(GPU_SITE) $(GPU_PIP_SOURCE) \
		-r benchmarks/gpu_requirements.txt
	PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) -c 'import torch, diffusers, policy_server.assembly.cli, cosmos3_runtime.engine; \
		print("torch", torch.__version__, torch.cuda.get_device_name(), "diffusers", diffusers.__version__)'
	PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider tests/test_runtime_device.py
	PYTHONPATH=$(GPU_SITE) PYTHONUNBUFFERED=1 $(GPU_PYTHON) benchmarks/gpu_suite.py --out $(BENCH_OUT)

bench-gpu-smoke: $(STAMP)
	$(PY) benchmarks/gpu_suite.py --smoke --out $(BENCH_OUT)

gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(GPU_WHEELS) -r benchmarks/gpu_requirements.txt

clean:
	rm -rf $(VENV) $(OPENPI_VENV) $(LEROBOT_VENV) $(VLAEVAL_VENV) $(METAWORLD_VENV) $(PUSHT_VENV) $(GPU_SITE) build *.egg-info
