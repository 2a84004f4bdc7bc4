"""The tensor-core kernels (TF32 and 3xTF32): their tile shape and fragment layout (``spec``), the
inline-PTX intrinsics (``ptx``), the generated source (``source``) and the kernels (``kernel``)."""
