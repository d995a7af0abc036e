"""Stand-in for Triton's compiled `triton_shm_monitor` (qa/common/shm_util.py imports it).

ShmLeakDetector only builds monitors for /dev/shm regions named
`triton_python_backend_shm_region*`, which reposerve never creates; so the import must
succeed and nothing is ever measured. Using a monitor is an error, not a silent pass.
"""


class SharedMemoryManager:
    def __init__(self, name):
        raise RuntimeError(f"triton_shm_monitor stand-in: cannot monitor Triton region {name}")
