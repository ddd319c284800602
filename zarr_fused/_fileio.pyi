import numpy as np
import numpy.typing as npt

def read_files_into(
    paths: list[bytes],
    arena: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.intp],
    capacities: npt.NDArray[np.intp],
    lengths: npt.NDArray[np.intp],
    stop: bytearray,
) -> int: ...
