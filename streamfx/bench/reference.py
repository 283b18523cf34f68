"""The reference StreamBP implementation's virtual environment.

The reference is the PyPI package ``streambp``, written against transformers 4.51.3.  It runs in
its own venv so that it never touches the project's transformers.  The venv is created with
``--system-site-packages`` (it reuses the installed torch, pinned to its version so that pip never
swaps it) and gets ``transformers==4.51.3``, ``trl`` (``streambp/__init__`` imports its trainers,
written against trl 0.18/0.19) and ``streambp`` itself.

Contract: :func:`ensure_venv` returns ``(python, None)`` when the venv imports both packages at
the pinned version (creating it when needed), else ``(None, reason)``; it never raises.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRANSFORMERS_PIN = "4.51.3"
TRL_SPEC = "trl>=0.18,<0.20"
CHECK = ("import streambp.stream_model, transformers; "
         f"assert transformers.__version__ == '{TRANSFORMERS_PIN}', transformers.__version__")


def _run(cmd: list[str], timeout: float) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout:g} s: {' '.join(cmd[:5])}"
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0:
        return True, ""
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return False, lines[-1][:200] if lines else f"exit code {proc.returncode}"


def ensure_venv(path: Path, timeout: float = 900.0, log=print) -> tuple[str | None, str | None]:
    path = Path(path).resolve()
    python = path / "bin" / "python"
    if python.exists() and _run([str(python), "-c", CHECK], 120)[0]:
        return str(python), None
    import torch

    log(f"[reference] creating venv {path} (transformers=={TRANSFORMERS_PIN}, {TRL_SPEC}, streambp) ...")
    pip = [str(python), "-m", "pip", "install", "-q", "--retries", "1", "--timeout", "30"]
    steps = [
        ("venv", [sys.executable, "-m", "venv", "--system-site-packages", str(path)]),
        ("pip install transformers trl", pip + [f"transformers=={TRANSFORMERS_PIN}", TRL_SPEC,
                                               f"torch=={torch.__version__}"]),
        ("pip install streambp", pip + ["--no-deps", "streambp"]),
        ("import check", [str(python), "-c", CHECK]),
    ]
    for name, cmd in steps:
        ok, why = _run(cmd, timeout)
        if not ok:
            reason = f"reference venv setup failed ({name}): {why}"
            log(f"[reference] {reason}")
            return None, reason
    return str(python), None
