"""GPUlayer's framework check: import one library, run a tiny computation on one device kind,
check the answer, and print one JSON line: {"version": ..., "usable": ..., "reason": ...}.

Run by the worker as `python3 -c <this file> CHECK` in a subprocess of its own per check, so a
library that crashes or hangs (broken driver, CUDA build newer than the driver) takes only
that subprocess down. CHECK is one of torch.cuda, torch.mps, jax.cuda, cupy.cuda, mlx.
"""

import importlib.metadata
import importlib.util
import json
import sys

EXPECTED = 90.0  # sum(2 * i for i in range(10))


def version_of(*dists):
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def torch_cuda():
    import torch

    v = torch.__version__
    if torch.version.cuda is None:
        return v, False, f"torch {v} is a CPU-only build (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return v, False, f"torch {v} (built for CUDA {torch.version.cuda}) cannot use CUDA: torch.cuda.is_available() is False (no NVIDIA driver or no visible GPU)"
    x = torch.arange(10, dtype=torch.float32, device="cuda")
    got = float((x * 2).sum().item())
    return v, got == EXPECTED, None if got == EXPECTED else f"computed {got}, expected {EXPECTED}"


def torch_mps():
    import torch

    v = torch.__version__
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return v, False, f"torch {v} cannot use MPS: torch.backends.mps.is_available() is False"
    x = torch.arange(10, dtype=torch.float32, device="mps")
    got = float((x * 2).sum().item())
    return v, got == EXPECTED, None if got == EXPECTED else f"computed {got}, expected {EXPECTED}"


def jax_cuda():
    import jax
    import jax.numpy as jnp

    v = jax.__version__
    try:
        devices = jax.devices("gpu")
    except RuntimeError as e:
        return v, False, f"jax {v} has no GPU backend (CPU-only jaxlib?): {e}"
    x = jax.device_put(jnp.arange(10, dtype=jnp.float32), devices[0])
    got = float((x * 2).sum())
    return v, got == EXPECTED, None if got == EXPECTED else f"computed {got}, expected {EXPECTED}"


def cupy_cuda():
    import cupy

    v = cupy.__version__
    got = float((cupy.arange(10, dtype=cupy.float32) * 2).sum().item())
    return v, got == EXPECTED, None if got == EXPECTED else f"computed {got}, expected {EXPECTED}"


def mlx_gpu():
    import mlx.core as mx

    v = version_of("mlx") or "unknown"
    mx.set_default_device(mx.gpu)
    got = float((mx.arange(10, dtype=mx.float32) * 2).sum().item())
    return v, got == EXPECTED, None if got == EXPECTED else f"computed {got}, expected {EXPECTED}"


CHECKS = {
    "torch.cuda": ("torch", ("torch",), torch_cuda),
    "torch.mps": ("torch", ("torch",), torch_mps),
    "jax.cuda": ("jax", ("jax",), jax_cuda),
    "cupy.cuda": ("cupy", ("cupy", "cupy-cuda12x", "cupy-cuda11x", "cupy-cuda13x"), cupy_cuda),
    "mlx": ("mlx", ("mlx",), mlx_gpu),
}


def main():
    name = sys.argv[1]
    module, dists, run = CHECKS[name]
    if importlib.util.find_spec(module) is None:
        print(json.dumps({"version": None, "usable": False, "reason": f"{module} is not installed"}))
        return
    try:
        version, usable, reason = run()
    except Exception as e:  # the reason is the point: report it, whatever it is
        version = version_of(*dists)
        usable, reason = False, f"{type(e).__name__}: {e}".strip()
    print(json.dumps({"version": version, "usable": bool(usable), "reason": reason}))


main()
