"""openpi-client's own virtualenv and the script that drives it, for the tests that run the real client.

``make test`` builds ``.venv-openpi``; ``OPENPI_CLIENT_PYTHON`` points elsewhere. In CI a missing one is a
broken set-up, not a reason to skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from server_fixtures import REPO_ROOT

OPENPI_PYTHON = Path(os.environ.get("OPENPI_CLIENT_PYTHON", REPO_ROOT / ".venv-openpi" / "bin" / "python"))
SCRIPT = Path(__file__).with_name("openpi_client_script.py")


def openpi_client_missing() -> str | None:
    """Why openpi-client cannot run here, to skip with; None when it can. Raises in CI, where it must."""
    if OPENPI_PYTHON.exists():
        return None
    if os.environ.get("CI"):
        raise RuntimeError(f"{OPENPI_PYTHON} is missing: `make test` should have built openpi-client's virtualenv")
    return f"openpi-client's virtualenv is missing ({OPENPI_PYTHON}); `make test` builds it"


def run_openpi_client(uri: str, convention: str, *options: str, horizon: int) -> dict:
    """Run ``openpi_client_script.py`` in openpi's virtualenv against ``uri``; the JSON it prints."""
    result = subprocess.run(
        [
            str(OPENPI_PYTHON),
            str(SCRIPT),
            "--uri",
            uri,
            "--convention",
            convention,
            "--horizon",
            str(horizon),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_PROXY": "*"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)
