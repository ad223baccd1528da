# AOT ID: ['0_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


cpp_fused_clone_transpose_0 = async_compile.cpp_pybinding(['const float*', 'const float*', 'float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       float* out_ptr0,
                       float* out_ptr1)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            #pragma GCC ivdep
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(2L); x1+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(5L); x2+=static_cast<int64_t>(1L))
                {
                    for(int64_t x3=static_cast<int64_t>(0L); x3<static_cast<int64_t>(4L); x3+=static_cast<int64_t>(8L))
                    {
                        {
                            if(C10_LIKELY(x3 >= static_cast<int64_t>(0L) && x3 < static_cast<int64_t>(4L)))
                            {
                                auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x3 + 4L*x1 + 8L*x2 + 40L*x0), static_cast<int64_t>(4L));
                                tmp0.store(out_ptr0 + static_cast<int64_t>(x3 + 4L*x2 + 20L*x1 + 40L*x0), static_cast<int64_t>(4L));
                            }
                        }
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(8L); x1+=static_cast<int64_t>(8L))
            {
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(7L); x2+=static_cast<int64_t>(8L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(8L) && x2 >= static_cast<int64_t>(0L) && x2 < static_cast<int64_t>(7L)))
                        {
                            alignas(std::max(std::size_t(8), alignof(float))) float tmp0[8*8];
                            transpose_mxn<float,static_cast<int64_t>(7L),static_cast<int64_t>(8),false>(in_ptr1 + static_cast<int64_t>(x1 + 8L*x2 + 56L*x0), static_cast<int64_t>(8L), tmp0, static_cast<int64_t>(7L));
                            for (long x1_inner = 0; x1_inner < static_cast<int64_t>(8); x1_inner++)
                            {
                                auto tmp1 = at::vec::Vectorized<float>::loadu(tmp0 + static_cast<int64_t>(7L*x1_inner), static_cast<int64_t>(7L));
                                tmp1.store(out_ptr1 + static_cast<int64_t>(x2 + 7L*x1 + 7L*x1_inner + 56L*x0), static_cast<int64_t>(7L));
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused_abs_add_amax_bitwise_not_div_eq_exp_gt_masked_fill_mul_ne_ones_like_sub_sum_view_where_zeros_like_1 = async_compile.cpp_pybinding(['const bool*', 'const float*', 'const float*', 'const bool*', 'const float*', 'float*', 'float*', 'float*', 'float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const bool* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       const bool* in_ptr3,
                       const float* in_ptr4,
                       float* out_ptr0,
                       float* out_ptr1,
                       float* out_ptr2,
                       float* out_ptr3,
                       float* out_ptr4)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            #pragma GCC ivdep
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(2L); x1+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(5L); x2+=static_cast<int64_t>(1L))
                {
                    {
                        {
                            auto tmp0 = in_ptr0[static_cast<int64_t>(7L*x2 + 35L*x0)];
                            auto tmp2 = in_ptr1[static_cast<int64_t>(7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp5 = in_ptr2[static_cast<int64_t>(7L*x2 + 35L*x0)];
                            auto tmp9 = in_ptr0[static_cast<int64_t>(1L + 7L*x2 + 35L*x0)];
                            auto tmp11 = in_ptr1[static_cast<int64_t>(1L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp13 = in_ptr2[static_cast<int64_t>(1L + 7L*x2 + 35L*x0)];
                            auto tmp17 = in_ptr0[static_cast<int64_t>(2L + 7L*x2 + 35L*x0)];
                            auto tmp19 = in_ptr1[static_cast<int64_t>(2L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp21 = in_ptr2[static_cast<int64_t>(2L + 7L*x2 + 35L*x0)];
                            auto tmp25 = in_ptr0[static_cast<int64_t>(3L + 7L*x2 + 35L*x0)];
                            auto tmp27 = in_ptr1[static_cast<int64_t>(3L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp29 = in_ptr2[static_cast<int64_t>(3L + 7L*x2 + 35L*x0)];
                            auto tmp33 = in_ptr0[static_cast<int64_t>(4L + 7L*x2 + 35L*x0)];
                            auto tmp35 = in_ptr1[static_cast<int64_t>(4L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp37 = in_ptr2[static_cast<int64_t>(4L + 7L*x2 + 35L*x0)];
                            auto tmp41 = in_ptr0[static_cast<int64_t>(5L + 7L*x2 + 35L*x0)];
                            auto tmp43 = in_ptr1[static_cast<int64_t>(5L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp45 = in_ptr2[static_cast<int64_t>(5L + 7L*x2 + 35L*x0)];
                            auto tmp49 = in_ptr0[static_cast<int64_t>(6L + 7L*x2 + 35L*x0)];
                            auto tmp51 = in_ptr1[static_cast<int64_t>(6L + 7L*x2 + 35L*x1 + 70L*x0)];
                            auto tmp53 = in_ptr2[static_cast<int64_t>(6L + 7L*x2 + 35L*x0)];
                            auto tmp1 = !tmp0;
                            auto tmp3 = static_cast<float>(0.5);
                            auto tmp4 = float(tmp2 * tmp3);
                            auto tmp6 = float(tmp4 + tmp5);
                            auto tmp7 = -std::numeric_limits<float>::infinity();
                            auto tmp8 = tmp1 ? tmp7 : tmp6;
                            auto tmp10 = !tmp9;
                            auto tmp12 = float(tmp11 * tmp3);
                            auto tmp14 = float(tmp12 + tmp13);
                            auto tmp15 = tmp10 ? tmp7 : tmp14;
                            auto tmp16 = max_propagate_nan(tmp8, tmp15);
                            auto tmp18 = !tmp17;
                            auto tmp20 = float(tmp19 * tmp3);
                            auto tmp22 = float(tmp20 + tmp21);
                            auto tmp23 = tmp18 ? tmp7 : tmp22;
                            auto tmp24 = max_propagate_nan(tmp16, tmp23);
                            auto tmp26 = !tmp25;
                            auto tmp28 = float(tmp27 * tmp3);
                            auto tmp30 = float(tmp28 + tmp29);
                            auto tmp31 = tmp26 ? tmp7 : tmp30;
                            auto tmp32 = max_propagate_nan(tmp24, tmp31);
                            auto tmp34 = !tmp33;
                            auto tmp36 = float(tmp35 * tmp3);
                            auto tmp38 = float(tmp36 + tmp37);
                            auto tmp39 = tmp34 ? tmp7 : tmp38;
                            auto tmp40 = max_propagate_nan(tmp32, tmp39);
                            auto tmp42 = !tmp41;
                            auto tmp44 = float(tmp43 * tmp3);
                            auto tmp46 = float(tmp44 + tmp45);
                            auto tmp47 = tmp42 ? tmp7 : tmp46;
                            auto tmp48 = max_propagate_nan(tmp40, tmp47);
                            auto tmp50 = !tmp49;
                            auto tmp52 = float(tmp51 * tmp3);
                            auto tmp54 = float(tmp52 + tmp53);
                            auto tmp55 = tmp50 ? tmp7 : tmp54;
                            auto tmp56 = max_propagate_nan(tmp48, tmp55);
                            out_ptr0[static_cast<int64_t>(x2 + 5L*x1 + 10L*x0)] = tmp56;
                        }
                    }
                    for(int64_t x3=static_cast<int64_t>(0L); x3<static_cast<int64_t>(7L); x3+=static_cast<int64_t>(8L))
                    {
                        {
                            if(C10_LIKELY(x3 >= static_cast<int64_t>(0L) && x3 < static_cast<int64_t>(7L)))
                            {
                                auto tmp0 = at::vec::VecMask<float,1>::from(in_ptr0 + static_cast<int64_t>(x3 + 7L*x2 + 35L*x0), static_cast<int64_t>(7L));
                                auto tmp2 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x3 + 7L*x2 + 35L*x1 + 70L*x0), static_cast<int64_t>(7L));
                                auto tmp6 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x3 + 7L*x2 + 35L*x0), static_cast<int64_t>(7L));
                                auto tmp11 = out_ptr0[static_cast<int64_t>(x2 + 5L*x1 + 10L*x0)];
                                auto tmp1 = ~tmp0;
                                auto tmp3 = static_cast<float>(0.5);
                                auto tmp4 = at::vec::Vectorized<float>(tmp3);
                                auto tmp5 = tmp2 * tmp4;
                                auto tmp7 = tmp5 + tmp6;
                                auto tmp8 = -std::numeric_limits<float>::infinity();
                                auto tmp9 = at::vec::Vectorized<float>(tmp8);
                                auto tmp10 = decltype(tmp9)::blendv(tmp7, tmp9, tmp1.template cast<float,1>());
                                auto tmp12 = tmp11 == tmp11;
                                auto tmp13 = std::abs(tmp11);
                                auto tmp14 = std::numeric_limits<float>::infinity();
                                auto tmp15 = tmp13 != tmp14;
                                auto tmp16 = tmp12 && tmp15;
                                auto tmp17 = static_cast<float>(0.0);
                                auto tmp18 = tmp16 ? tmp11 : tmp17;
                                auto tmp19 = at::vec::Vectorized<float>(tmp18);
                                auto tmp20 = tmp10 - tmp19;
                                auto tmp21 = tmp20.exp();
                                tmp21.store(out_ptr1 + static_cast<int64_t>(x3 + 7L*x2 + 35L*x1 + 70L*x0), static_cast<int64_t>(7L));
                            }
                        }
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(20L); x0+=static_cast<int64_t>(1L))
        {
            {
                {
                    auto tmp0 = out_ptr1[static_cast<int64_t>(7L*x0)];
                    auto tmp1 = out_ptr1[static_cast<int64_t>(1L + 7L*x0)];
                    auto tmp3 = out_ptr1[static_cast<int64_t>(2L + 7L*x0)];
                    auto tmp5 = out_ptr1[static_cast<int64_t>(3L + 7L*x0)];
                    auto tmp7 = out_ptr1[static_cast<int64_t>(4L + 7L*x0)];
                    auto tmp9 = out_ptr1[static_cast<int64_t>(5L + 7L*x0)];
                    auto tmp11 = out_ptr1[static_cast<int64_t>(6L + 7L*x0)];
                    auto tmp2 = float(tmp0 + tmp1);
                    auto tmp4 = float(tmp2 + tmp3);
                    auto tmp6 = float(tmp4 + tmp5);
                    auto tmp8 = float(tmp6 + tmp7);
                    auto tmp10 = float(tmp8 + tmp9);
                    auto tmp12 = float(tmp10 + tmp11);
                    out_ptr2[static_cast<int64_t>(x0)] = tmp12;
                }
            }
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(7L); x1+=static_cast<int64_t>(8L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(7L)))
                    {
                        auto tmp0 = at::vec::Vectorized<float>::loadu(out_ptr1 + static_cast<int64_t>(x1 + 7L*x0), static_cast<int64_t>(7L));
                        auto tmp1 = out_ptr2[static_cast<int64_t>(x0)];
                        auto tmp2 = static_cast<float>(0.0);
                        auto tmp3 = tmp1 > tmp2;
                        auto tmp4 = static_cast<float>(1.0);
                        auto tmp5 = tmp3 ? tmp1 : tmp4;
                        auto tmp6 = at::vec::Vectorized<float>(tmp5);
                        auto tmp7 = tmp0 / tmp6;
                        tmp7.store(out_ptr3 + static_cast<int64_t>(x1 + 7L*x0), static_cast<int64_t>(7L));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            #pragma GCC ivdep
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(2L); x1+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(7L); x2+=static_cast<int64_t>(1L))
                {
                    for(int64_t x3=static_cast<int64_t>(0L); x3<static_cast<int64_t>(4L); x3+=static_cast<int64_t>(8L))
                    {
                        {
                            if(C10_LIKELY(x3 >= static_cast<int64_t>(0L) && x3 < static_cast<int64_t>(1)))
                            {
                                for (int64_t x3_tail = static_cast<int64_t>(0L);x3_tail < static_cast<int64_t>(4L); x3_tail++)
                                {
                                    auto tmp0 = in_ptr3[static_cast<int64_t>(x2 + 7L*x0)];
                                    auto tmp1 = in_ptr4[static_cast<int64_t>(x3_tail + 4L*x1 + 8L*x2 + 56L*x0)];
                                    auto tmp2 = static_cast<float>(0.0);
                                    auto tmp3 = tmp0 ? tmp2 : tmp1;
                                    out_ptr4[static_cast<int64_t>(x3_tail + 4L*x2 + 28L*x1 + 56L*x0)] = tmp3;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1 = args
        args.clear()
        assert_size_stride(arg1_1, (2, 2, 5, 4), (40, 4, 8, 1), 'input')
        buf0 = empty_strided_cpu((2, 2, 5, 4), (40, 20, 4, 1), torch.float32)
        assert_size_stride(arg0_1, (2, 2, 7, 4), (56, 4, 8, 1), 'input')
        buf1 = empty_strided_cpu((2, 2, 4, 7), (56, 28, 7, 1), torch.float32)
        cpp_fused_clone_transpose_0(arg1_1, arg0_1, buf0, buf1)
        del arg0_1
        del arg1_1
        buf2 = empty_strided_cpu((4, 5, 7), (35, 7, 1), torch.float32)
        # Topologically Sorted Source Nodes: [matmul, transpose], Original ATen: [aten.clone, aten._unsafe_view, aten.transpose, aten.bmm]
        extern_kernels.bmm(reinterpret_tensor(buf0, (4, 5, 4), (20, 4, 1), 0), reinterpret_tensor(buf1, (4, 4, 7), (28, 7, 1), 0), out=buf2)
        del buf0
        del buf1
        assert_size_stride(arg3_1, (2, 1, 5, 7), (35, 35, 7, 1), 'input')
        assert_size_stride(arg2_1, (2, 1, 5, 7), (35, 35, 7, 1), 'input')
        buf3 = empty_strided_cpu((2, 2, 5, 1), (10, 5, 1, 20), torch.float32)
        buf4 = empty_strided_cpu((2, 2, 5, 7), (70, 35, 7, 1), torch.float32)
        buf5 = empty_strided_cpu((2, 2, 5, 1), (10, 5, 1, 20), torch.float32)
        buf6 = empty_strided_cpu((2, 2, 5, 7), (70, 35, 7, 1), torch.float32)
        assert_size_stride(arg4_1, (2, 1, 7, 1), (7, 7, 1, 1), 'input')
        assert_size_stride(arg5_1, (2, 2, 7, 4), (56, 4, 8, 1), 'input')
        buf7 = empty_strided_cpu((2, 2, 7, 4), (56, 28, 4, 1), torch.float32)
        cpp_fused_abs_add_amax_bitwise_not_div_eq_exp_gt_masked_fill_mul_ne_ones_like_sub_sum_view_where_zeros_like_1(arg3_1, buf2, arg2_1, arg4_1, arg5_1, buf3, buf4, buf5, buf6, buf7)
        del arg2_1
        del arg3_1
        del arg4_1
        del arg5_1
        del buf2
        del buf3
        del buf4
        del buf5
        buf8 = empty_strided_cpu((4, 5, 4), (20, 4, 1), torch.float32)
        # Topologically Sorted Source Nodes: [gt, ones_like, where_1, truediv, matmul_1, v], Original ATen: [aten.gt, aten.ones_like, aten.where, aten.div, aten.view, aten.masked_fill, aten.bmm]
        extern_kernels.bmm(reinterpret_tensor(buf6, (4, 5, 7), (35, 7, 1), 0), reinterpret_tensor(buf7, (4, 7, 4), (28, 4, 1), 0), out=buf8)
        return (reinterpret_tensor(buf8, (2, 2, 5, 4), (40, 20, 4, 1), 0), )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((2, 2, 7, 4), (56, 4, 8, 1), device='cpu', dtype=torch.float32)
    arg1_1 = rand_strided((2, 2, 5, 4), (40, 4, 8, 1), device='cpu', dtype=torch.float32)
    arg2_1 = rand_strided((2, 1, 5, 7), (35, 35, 7, 1), device='cpu', dtype=torch.float32)
    arg3_1 = rand_strided((2, 1, 5, 7), (35, 35, 7, 1), device='cpu', dtype=torch.bool)
    arg4_1 = rand_strided((2, 1, 7, 1), (7, 7, 1, 1), device='cpu', dtype=torch.bool)
    arg5_1 = rand_strided((2, 2, 7, 4), (56, 4, 8, 1), device='cpu', dtype=torch.float32)
    return [arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat, device='cpu')


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
