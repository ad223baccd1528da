
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

// Python bindings to call kernel():
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sstream>
#include <cstdlib>
#include <cerrno>

// This is defined in guards.cpp so we don't need to import PyTorch headers that are slooow.
// We manually link it below to workaround issues with fbcode build.
static void* (*_torchinductor_pyobject_tensor_data_ptr)(PyObject* obj);

template <typename T> static inline T parse_arg(PyObject* args, size_t n) {
    static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
    return static_cast<T>(_torchinductor_pyobject_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
}
template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if(result == -1 && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected int arg");
    return result;
}
template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
    if(result == reinterpret_cast<void*>(-1) && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected int arg");
    return reinterpret_cast<uintptr_t>(result);
}
template <> inline float parse_arg<float>(PyObject* args, size_t n) {
    auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if(result == -1.0 && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected float arg");
    return static_cast<float>(result);
}



static PyObject* kernel_py(PyObject* self, PyObject* args) {
    try {
        if(!PyTuple_CheckExact(args)) [[unlikely]]
            throw std::runtime_error("tuple args required");
        if(PyTuple_GET_SIZE(args) != 10) [[unlikely]]
            throw std::runtime_error("requires 10 args");
        kernel(parse_arg<bool*>(args, 0), parse_arg<float*>(args, 1), parse_arg<float*>(args, 2), parse_arg<bool*>(args, 3), parse_arg<float*>(args, 4), parse_arg<float*>(args, 5), parse_arg<float*>(args, 6), parse_arg<float*>(args, 7), parse_arg<float*>(args, 8), parse_arg<float*>(args, 9)); Py_RETURN_NONE;
    } catch(std::exception const& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    } catch(...) {
        PyErr_SetString(PyExc_RuntimeError, "unhandled error");
        return nullptr;
    }
}

static PyMethodDef py_methods[] = {
    {"kernel", kernel_py, METH_VARARGS, ""},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef py_module =
    {PyModuleDef_HEAD_INIT, "kernel", NULL, -1, py_methods};

PyMODINIT_FUNC PyInit_kernel(void) {
    const char* str_addr = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if(!str_addr) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
        return nullptr;
    }

    char* endptr = nullptr;
    errno = 0;
    uintptr_t addr = std::strtoull(str_addr, &endptr, 10);
    if(errno != 0 || endptr == str_addr || addr == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Failed to parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        return nullptr;
    }
    _torchinductor_pyobject_tensor_data_ptr =
        reinterpret_cast<decltype(_torchinductor_pyobject_tensor_data_ptr)>(addr);
    PyObject* module = PyModule_Create(&py_module);
    if (module == NULL) {
        return NULL;
    }
    #ifdef Py_GIL_DISABLED
        PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED);
    #endif
    return module;
}
