// The one table of ckptd's tensor element types. Everything that knows a dtype's size or names
// expands this list: the daemon (format/dtype.h), the C++ client (client.h's DType, its sizes,
// names and wire conversions), ckptctl export (safetensors names) and the Python binding, which
// exports it as `_ckptd.DTYPES` for the Python package (ckptd/_arrays.py) to build its maps from.
//
// It lives next to common.proto, whose `DType` enum it describes: the wire enum is the contract
// both the daemon and the clients build against, and every target that links ckptd_proto (daemon
// modules, client, binding, ckptctl, tests) has this directory on its include path. It is not in
// daemon/include/ckptd (the storage plugins' API, which has no tensors) and it includes nothing,
// so the client's public header can expand it without pulling in protobuf.
//
// CKPTD_DTYPES(X) calls X(PROTO, CLIENT, NAME, SIZE, SAFETENSORS, NUMPY_NATIVE) once per dtype:
//   PROTO         the ckptd::v1::DType enumerator (a bare token: write `v1::PROTO` at the use)
//   CLIENT        the ckptd::DType enumerator of the C++ client (client.h)
//   NAME          the lowercase name numpy and torch spell it with ("bfloat16"); torch.NAME exists
//   SIZE          bytes per element
//   SAFETENSORS   the Hugging Face safetensors dtype string ("BF16")
//   NUMPY_NATIVE  whether numpy itself has np.dtype(NAME) (else ml_dtypes or a same-size uint)
// Rows are in the order of the wire enum's values (1, 2, ...), so the client enum's value + 1 is
// the wire value. tests/unit/format/dtype_test.cc checks that every value of v1::DType except
// DTYPE_UNSPECIFIED has exactly one row; tests/unit/ctl/dtype_table_test.cc and
// tests/python/test_dtypes.py check the client's and Python's views against it.
//
// Adding a dtype: add the value to common.proto and a row here (in value order); nothing else.
#pragma once

// clang-format off
#define CKPTD_DTYPES(X)                                              \
  X(FLOAT32,       kFloat32,      "float32",       4, "F32",     true)  \
  X(FLOAT64,       kFloat64,      "float64",       8, "F64",     true)  \
  X(FLOAT16,       kFloat16,      "float16",       2, "F16",     true)  \
  X(BFLOAT16,      kBFloat16,     "bfloat16",      2, "BF16",    false) \
  X(FLOAT8_E4M3FN, kFloat8E4M3FN, "float8_e4m3fn", 1, "F8_E4M3", false) \
  X(FLOAT8_E5M2,   kFloat8E5M2,   "float8_e5m2",   1, "F8_E5M2", false) \
  X(INT8,          kInt8,         "int8",          1, "I8",      true)  \
  X(UINT8,         kUInt8,        "uint8",         1, "U8",      true)  \
  X(INT16,         kInt16,        "int16",         2, "I16",     true)  \
  X(INT32,         kInt32,        "int32",         4, "I32",     true)  \
  X(INT64,         kInt64,        "int64",         8, "I64",     true)  \
  X(BOOL,          kBool,         "bool",          1, "BOOL",    true)  \
  X(UINT16,        kUInt16,       "uint16",        2, "U16",     true)  \
  X(UINT32,        kUInt32,       "uint32",        4, "U32",     true)  \
  X(UINT64,        kUInt64,       "uint64",        8, "U64",     true)
// clang-format on
