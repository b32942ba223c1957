"""GPU kernels (CUDA source beside its PyCUDA loader); imported only on CUDA deployments."""
