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
FFMPEG_LIBRARIES := libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
# Headless OpenGL for MuJoCo's offscreen rendering: EGL on Mesa's software rasterizer (no GPU, no display).
GL_PACKAGES := libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri
# The dashboard test drives Debian's Chromium (never a browser a tool downloads itself).
BROWSER_PACKAGES := chromium

.PHONY: demo test test-slow install clean system-deps test-system-deps

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
	$(call apt_ensure,$(GL_PACKAGES) $(BROWSER_PACKAGES) $(FFMPEG_LIBRARIES))

install: $(STAMP) system-deps

demo: $(STAMP) system-deps
	$(VENV)/bin/cosmos3-demo-mujoco

test: $(STAMP) $(OPENPI_STAMP) $(LEROBOT_STAMP) test-system-deps
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) $(OPENPI_VENV) $(LEROBOT_VENV) build *.egg-info
