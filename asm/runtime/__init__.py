"""The CuPy runtime: build-once kernel cache, launch planning (layouts, operand swap), `gemm`."""
