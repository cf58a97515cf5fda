// Two custom ops registered through libtorch's stable ABI, as vLLM's CUDA ops are (bench/op_leak.py builds it):
// one takes a `str`, the other does not. The `str` one costs a heap std::string per call on torch < 2.14
// (pytorch/pytorch#191340): vLLM's reshape_and_cache_flash takes `str kv_cache_dtype` and so leaks on every eager
// call (docs/reliability.md, section 4).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <string>

int64_t with_str(torch::stable::Tensor x, std::string s) { return static_cast<int64_t>(s.size()); }
int64_t without_str(torch::stable::Tensor x, int64_t n) { return n; }

STABLE_TORCH_LIBRARY(pocserve_op_leak, m) {
  m.def("with_str(Tensor x, str s) -> int");
  m.def("without_str(Tensor x, int n) -> int");
}

STABLE_TORCH_LIBRARY_IMPL(pocserve_op_leak, CPU, m) {
  m.impl("with_str", TORCH_BOX(&with_str));
  m.impl("without_str", TORCH_BOX(&without_str));
}
