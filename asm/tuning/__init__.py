"""The tuning workflow (`asmgemm tune` without the command line): enumerate a kernel's `.tune`
space and build every candidate on the CPU (space.py), check and time the survivors on the GPU
(trials.py), and store the winner in the tuning cache (store.py); workflow.py runs the steps from
one frozen TuneConfig. The runtime reads the cache (asmgemm.runtime.tune_cache) and never imports
this package."""
