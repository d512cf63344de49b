"""What a CUDA binary (a cubin: an ELF of machine type EM_CUDA) says about itself, read from its header:
the compute capability it was built for, and whether the file holds all its header promises."""
from __future__ import annotations

import struct

_EM_CUDA = 190


def cuda_elf_arch(binary: bytes) -> int | None:
    """The compute capability a CUDA ELF was built for; None if the ELF ABI version is not known here.
    Raises ValueError when ``binary`` is not a CUDA ELF at all."""
    if len(binary) < 52 or binary[:4] != b"\x7fELF" or struct.unpack_from("<H", binary, 18)[0] != _EM_CUDA:
        raise ValueError("its binary is not a CUDA ELF")
    flags = struct.unpack_from("<I", binary, 48)[0]
    abi = binary[8]
    if abi == 7:  # the capability in the low byte
        return flags & 0xFF
    if abi == 8:  # one byte up
        return (flags >> 8) & 0xFF
    return None


def cut_short(binary: bytes) -> str | None:
    """Why ``binary``, a CUDA ELF, is not whole (its section header table, which the linker writes last,
    ends past the end of the file), or None. Raises ValueError when it is not a CUDA ELF at all."""
    cuda_elf_arch(binary)
    if binary[4] == 2:  # ELFCLASS64: e_shoff at 0x28, e_shentsize and e_shnum at 0x3A and 0x3C
        if len(binary) < 64:
            return "its ELF header is cut short"
        offset, entry_size, count = struct.unpack_from("<Q", binary, 0x28)[0], *struct.unpack_from("<HH", binary, 0x3A)
    else:  # ELFCLASS32
        offset, entry_size, count = struct.unpack_from("<I", binary, 0x20)[0], *struct.unpack_from("<HH", binary, 0x2E)
    end = offset + entry_size * count
    if end > len(binary):
        return f"it is cut short ({len(binary)} bytes, its section headers end at {end})"
    return None
