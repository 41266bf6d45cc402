"""The floor the server is assembled and run from: the command line (``cosmos3-serve``), the WebSocket server
and its routing table. Everything else hangs below it; nothing below imports it."""
