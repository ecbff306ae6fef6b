"""The first seed's setup on Modal: SGLang on one GPU with openjev in front, in one container.

openjev starts SGLang as its child (--sglang-python), supervises it, and exits if it dies;
Modal restarts the container. Weights live in a Modal Volume, downloaded once. Containers
scale to zero when idle (cold starts cost minutes: weights, CUDA graphs); set
OPENJEV_MIN_CONTAINERS=1 to keep one warm.

    modal run deploy/modal_app.py::download          # once: weights into the volume
    modal deploy deploy/modal_app.py                 # serve; prints the URL
    OPENJEV_MIN_CONTAINERS=1 modal deploy deploy/modal_app.py
"""

import os
import subprocess
from pathlib import Path

import modal

MODEL = os.environ.get("OPENJEV_MODEL", "nvidia/Qwen3.6-35B-A3B-NVFP4")
GPU = os.environ.get("OPENJEV_GPU", "B200")
MIN_CONTAINERS = int(os.environ.get("OPENJEV_MIN_CONTAINERS", "0"))
SGLANG_IMAGE = os.environ.get("OPENJEV_SGLANG_IMAGE", "lmsysorg/sglang:v0.5.9-cu129")
WEIGHTS = "/weights"
REPO = Path(__file__).resolve().parents[1]

weights = modal.Volume.from_name("openjev-weights", create_if_missing=True)
image = (
    modal.Image.from_registry(SGLANG_IMAGE)
    .add_local_dir(REPO, "/opt/openjev", copy=True, ignore=[".venv*", ".git", "**/__pycache__"])
    .run_commands("python -m pip install /opt/openjev")
)
app = modal.App("openjev", image=image)


def _local_path(model: str) -> str:
    return f"{WEIGHTS}/{model.replace('/', '--')}"


# Gated models: add secrets=[modal.Secret.from_name("huggingface")] holding HF_TOKEN.
@app.function(volumes={WEIGHTS: weights}, timeout=3600)
def download(model: str = MODEL) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(model, local_dir=_local_path(model))
    weights.commit()


# To require API keys: a Modal secret holding OPENJEV_API_KEYS, added as secrets=[...].
@app.function(
    gpu=GPU, volumes={WEIGHTS: weights}, min_containers=MIN_CONTAINERS, scaledown_window=300, timeout=24 * 3600
)
@modal.concurrent(max_inputs=256)
@modal.web_server(port=8000, startup_timeout=1800)
def serve() -> None:
    subprocess.Popen(
        [
            "openjev",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--engine",
            "sglang",
            "--sglang-python",
            "python",
            "--model",
            _local_path(MODEL),
            "--strategy",
            "auto",
            "--",
            "--mem-fraction-static",
            "0.85",
        ]
    )
