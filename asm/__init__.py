"""asmgemm: a GPU assembler toolkit for hand-written GEMM kernels (PTX macro-assembly, .sasm)."""
__version__ = "0.1.0"
