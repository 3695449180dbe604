"""The version of asmgemm, in a module of its own: the emitted PTX and the kernel cache's keys carry
it, and those stages must not import the package facade (asmgemm/__init__.py) that sits above them."""
__version__ = "0.1.0"
