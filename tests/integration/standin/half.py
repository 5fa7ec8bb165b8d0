"""FP16 and BF16 tensors, for the client matrix (tests/tensor_models.py): HALF_SCALED is HALF
times 3 in FP16, BRAIN_SCALED is BRAIN times 3 rounded to BF16 (nearest, ties to even).

The Python backend cannot show a BF16 tensor as numpy (numpy has no bfloat16): it hands it out
through DLPack only. So BRAIN's bits are read through its DLPack capsule with ctypes, scaled in
place, and the same capsule becomes the output."""

import ctypes

import numpy as np
import triton_python_backend_utils as pb_utils


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def bf16_bits(capsule):
    """The BF16 tensor behind a DLPack capsule, as a writable uint16 array of its bits."""
    tensor = _DLTensor.from_address(_pointer(capsule, b"dltensor"))
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    count = int(np.prod(shape))
    memory = (ctypes.c_uint16 * count).from_address(tensor.data + tensor.byte_offset)
    return np.ctypeslib.as_array(memory).reshape(shape)


def times_three(bits):
    wide = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(3)
    wide = wide.view(np.uint32)
    return ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(np.uint16)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            half = pb_utils.get_input_tensor_by_name(request, "HALF").as_numpy()
            capsule = pb_utils.get_input_tensor_by_name(request, "BRAIN").to_dlpack()
            bits = bf16_bits(capsule)
            bits[...] = times_three(bits)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("HALF_SCALED", half * np.float16(3)),
                pb_utils.Tensor.from_dlpack("BRAIN_SCALED", capsule)]))
        return responses
