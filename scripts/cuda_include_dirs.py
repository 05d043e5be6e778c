"""Print the include folders of the nvidia-* header wheels in this Python (CMake reads it)."""
import os

try:
    import nvidia  # namespace package shared by the nvidia-* wheels
except ImportError:
    raise SystemExit(0)

dirs = []
for root in getattr(nvidia, "__path__", []):
    for sub in ("cu13/include", "cu12/include", "cuda_runtime/include", "cufile/include"):
        path = os.path.join(root, sub)
        if os.path.isdir(path):
            dirs.append(path)
print(";".join(dirs))
