#!/usr/bin/env bash
# SGLang's own frontend (sglang.lang) for tests/integration/test_sglang_client.py: the sglang wheel without its
# server dependencies (CUDA torch, flashinfer, ...), plus the modules its frontend's imports reach that radixrt's
# test extra does not bring (found by importing it in a fresh venv). The version is the one the test checks.
set -euo pipefail
pip install -q --no-deps "sglang==0.5.23" pybase64 msgspec pillow ipython traitlets
