
#include <torch/csrc/inductor/cpp_prefix.h>
#include <c10/util/Unroll.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <ATen/native/cpu/utils.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/Context.h>



template <int64_t BLOCK_M, int64_t BLOCK_N, bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm_kernel(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    constexpr auto VLEN = Vectorized::size();
    constexpr auto ROWS = BLOCK_M;
    constexpr auto COLS = BLOCK_N / VLEN;

    Vectorized va;
    at::vec::VectorizedN<float, COLS> vb;
    at::vec::VectorizedN<float, ROWS*COLS> vc;
    auto loadc = [&](auto i) {
        if constexpr (accum) {
            constexpr int row = i / COLS;
            constexpr int col = i % COLS;
            vc[i] = Vectorized::loadu(C + row * ldc + col * VLEN);
        } else {
            vc[i] = Vectorized(0.0f);
        }
    };
    c10::ForcedUnroll<ROWS * COLS>{}(loadc);

    auto compute = [&, COLS](auto i, int k) {
        constexpr int row = i / COLS;
        constexpr int col = i % COLS;
        if constexpr (col == 0) {
            va = Vectorized(static_cast<float>(A[row * lda + k]));
        }

        if constexpr (row == 0) {
            vb[col] = Vectorized::loadu(B + k * ldb + col * VLEN);

        }

        constexpr int idx = row * COLS + col;
        vc[idx] = at::vec::fmadd(va, vb[col], vc[idx]);
    };

    for (int k = 0; k < K; ++k) {
        c10::ForcedUnroll<ROWS * COLS>{}(compute, k);
    }

    // store to C
    auto storec = [&](auto i) {
        constexpr int row = i / COLS;
        constexpr int col = i % COLS;
        vc[i].store(C + row * ldc + col * VLEN);
    };
    c10::ForcedUnroll<ROWS * COLS>{}(storec);
}

template <int64_t BLOCK_M, int64_t BLOCK_N, bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm_ntail_kernel(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t N,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    constexpr auto VLEN = Vectorized::size();
    constexpr auto ROWS = BLOCK_M;
    constexpr auto COLS = BLOCK_N / VLEN;

    Vectorized va;
    at::vec::VectorizedN<float, COLS> vb;
    at::vec::VectorizedN<float, ROWS*COLS> vc;
    int64_t rCOLS = (N + VLEN - 1) / VLEN;
    int ntail = N % VLEN;
    auto loadc = [&](auto i) {
        if constexpr (accum) {
            constexpr int row = i / COLS;
            constexpr int col = i % COLS;
            int load_size = (col == rCOLS - 1 && ntail != 0) ? ntail : VLEN;
            if (col < rCOLS) {
                vc[i] = Vectorized::loadu(C + row * ldc + col * VLEN, load_size);
            }
        } else {
            vc[i] = Vectorized(0.0f);
        }
    };
    c10::ForcedUnroll<ROWS * COLS>{}(loadc);

    auto compute = [&, COLS](auto i, int k) {
        constexpr int row = i / COLS;
        constexpr int col = i % COLS;
        int load_size = (col == rCOLS - 1 && ntail != 0) ? ntail : VLEN;
        if constexpr (col == 0) {
            va = Vectorized(static_cast<float>(A[row * lda + k]));
        }

        if constexpr (row == 0) {
            if (col < rCOLS) {
                vb[col] = Vectorized::loadu(B + k * ldb + col * VLEN, load_size);
            } else {
                vb[col] = Vectorized(0.0f);
            }

        }

        constexpr int idx = row * COLS + col;
        if (col < rCOLS) {
            vc[idx] = at::vec::fmadd(va, vb[col], vc[idx]);
        }
    };

    for (int k = 0; k < K; ++k) {
        c10::ForcedUnroll<ROWS * COLS>{}(compute, k);
    }

    // store to C
    auto storec = [&](auto i) {
        constexpr int row = i / COLS;
        constexpr int col = i % COLS;
        int store_size = (col == rCOLS - 1 && ntail != 0) ? ntail : VLEN;
        if (col < rCOLS) {
            vc[i].store(C + row * ldc + col * VLEN, store_size);
        }
    };
    c10::ForcedUnroll<ROWS * COLS>{}(storec);
}

template <bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t M,
    int64_t N,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    constexpr auto VLEN = Vectorized::size();
    TORCH_CHECK(16 % VLEN == 0, "block_n dimension must be multiple of Vector size");
    TORCH_CHECK(K % 1 == 0, "K dimension must be multiple of 1");
    // TODO(jgong5): loop unroll for M and N
    for (int64_t m = 0; m < M; m += 1) {
        int64_t block_m = std::min<int64_t>(M - m, 1);
        for (int64_t n = 0; n < N; n += 16) {
            int64_t block_n = std::min<int64_t>(N - n, 16);
            if (block_m == 1 && block_n == 16) {
                kernel_kernel_micro_gemm_kernel<1, 16, accum, prefetch>(
                    A + m * lda,
                    B + n,
                    C + m * ldc + n,
                    K,
                    lda,
                    ldb,
                    ldc
                );
            } else if (block_n == 16){
                switch (block_m) {
                default:
                    TORCH_CHECK(false, "Unsupported block_m: 1");
                }
            } else {
                switch (block_m) {
                case 1:
                    kernel_kernel_micro_gemm_ntail_kernel<1, 16, accum, prefetch>(
                        A + m * lda,
                        B + n,
                        C + m * ldc + n,
                        block_n,
                        K,
                        lda,
                        ldb,
                        ldc
                    );
                    break;
                default:
                    TORCH_CHECK(false, "Unsupported block_m: 1");
                }
            }
        }
    }
}

template <int64_t BLOCK_M, int64_t BLOCK_N, bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm_transpose_b_transpose_b_kernel(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    // Use 2 implementations for the transposed B:
    // First implementation:
    //   Transpose first and then perform outer product calculation in sub-blocks,
    //   which introduces an additional transpose overhead of [K, N] compared to the non-transpose version.
    // Second implementation:
    //   Directly perform inner product calculation in sub-blocks,
    //   which introduces an additional vector reduction of [M, N] compared to the non-transpose version.
    // Therefore, when M * N / (K * N) is large, the first implementation has better performance.
    if (K % Vectorized::size() == 0 && 24 * BLOCK_M > K) {
        // First implementation:
        constexpr auto VLEN = Vectorized::size();
        constexpr auto ROWS = BLOCK_M;
        constexpr auto COLS = BLOCK_N / VLEN;
        int _K = K / VLEN;
        Vectorized va;
        at::vec::VectorizedN<float, VLEN> vb;
        at::vec::VectorizedN<float, ROWS*COLS> vc;
        auto loadc = [&](auto i) {
            if constexpr (accum) {
                constexpr int row = i / COLS;
                constexpr int col = i % COLS;
                vc[i] = Vectorized::loadu(C + row * ldc + col * VLEN);
            } else {
                vc[i] = Vectorized(0.0f);
            }
        };
        c10::ForcedUnroll<ROWS * COLS>{}(loadc);
        auto unroll_loadB = [&](auto i, const float* __restrict__ src_ptr) {
            vb[i] = Vectorized::loadu(src_ptr + i * ldb, VLEN);
        };
        auto compute_trans = [&, COLS](auto i, int k) {
            constexpr int row = i % ROWS;
            constexpr int col = i / ROWS;
            constexpr int e_col = col * VLEN;
            int idk = k * VLEN;
            if constexpr (row == 0) {
                c10::ForcedUnroll<VLEN>{}(unroll_loadB, B + e_col * ldb + idk);
                at::vec::transpose_block(vb);
            }
            constexpr int idx = row * COLS + col;
            #pragma GCC unroll 16
            for (int j = 0; j < VLEN; j++) {
                va = Vectorized(static_cast<float>(A[row * lda + idk + j]));
                vc[idx] = at::vec::fmadd(va, vb[j], vc[idx]);
            }
        };
        for (int k = 0; k < _K; ++k) {
            c10::ForcedUnroll<ROWS * COLS>{}(compute_trans, k);
        }
        // store to C
        auto storec = [&](auto i) {
            constexpr int row = i / COLS;
            constexpr int col = i % COLS;
            vc[i].store(C + row * ldc + col * VLEN);
        };
        c10::ForcedUnroll<ROWS * COLS>{}(storec);
    } else {
        // Second implementation
        constexpr auto VLEN = Vectorized::size();
        int _K = (K + VLEN - 1) / VLEN;
        // sub-block size of BLOCK_N and BLOCK_M
        constexpr int sM = 1;
        constexpr int sN = 4;
        constexpr int bN = (BLOCK_N + sN - 1) / sN;
        constexpr int bM = (BLOCK_M + sM - 1) / sM;
        at::vec::Vectorized<float> va;
        at::vec::VectorizedN<float, sN> vb;
        at::vec::VectorizedN<float, sN * sM> vmid;
        constexpr int ntail = BLOCK_N % sN;
        constexpr int mtail = BLOCK_M % sM;
        int ktail = K % VLEN;

        auto compute_trans = [&](int m, int n, int k) {
            int e_n = (n == bN - 1 && ntail != 0) ? (BLOCK_N - n * sN) : sN;
            int e_m = (m == bM - 1 && mtail != 0) ? (BLOCK_M - m * sM) : sM;
            int e_k = (k == _K - 1 && ktail != 0) ? (K - k * VLEN) : VLEN;
            #pragma GCC unroll 4
            for (int i = 0; i < e_n; i++) {
                vb[i] = Vectorized::loadu(B + (sN * n + i) * ldb + k * VLEN, e_k);
            }

            #pragma GCC unroll 1
            for (int s = 0; s < e_m; s++) {
                va = Vectorized::loadu(A + (sM * m + s) * lda + k * VLEN, e_k);
                if (k == 0) {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        vmid[sN * s + i] = at::vec::fmadd(va, vb[i], Vectorized(0.0f));
                    }
                } else {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        vmid[sN * s + i] = at::vec::fmadd(va, vb[i], vmid[sN * s + i]);
                    }
                }
            }

            // store to C
            if (k == _K - 1) {
                #pragma GCC unroll 1
                for (int s = 0; s < e_m; s++) {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        auto v = at::vec::vec_reduce_all([](Vectorized& x, Vectorized& y) { return x + y; }, vmid[sN * s + i]);
                        if constexpr (accum) {
                            auto c = *(C + (sM * m + s) * ldc + sN * n + i);
                            *(C + (sM * m + s) * ldc + sN * n + i) = c + v;
                        } else {
                            *(C + (sM * m + s) * ldc + sN * n + i) = v;
                        }
                    }
                }
            }
        };

        for (int n = 0; n < bN; ++n) {
            for (int m = 0; m < bM; ++m) {
                for (int k = 0; k < _K; ++k) {
                    compute_trans(m, n, k);
                }
            }
        }
    }
}

template <int64_t BLOCK_M, int64_t BLOCK_N, bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm_transpose_b_ntail_transpose_b_kernel(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t N,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    // Use 2 implementations for the transposed B:
    // First implementation:
    //   Transpose first and then perform outer product calculation in sub-blocks,
    //   which introduces an additional transpose overhead of [K, N] compared to the non-transpose version.
    // Second implementation:
    //   Directly perform inner product calculation in sub-blocks,
    //   which introduces an additional vector reduction of [M, N] compared to the non-transpose version.
    // Therefore, when M * N / (K * N) is large, the first implementation has better performance.
    if (K % Vectorized::size() == 0 && N % Vectorized::size() == 0 && 24 * BLOCK_M > K) {
        // First implementation:
        constexpr auto VLEN = Vectorized::size();
        constexpr auto ROWS = BLOCK_M;
        constexpr auto COLS = BLOCK_N / VLEN;
        int _K = K / VLEN;
        Vectorized va;
        at::vec::VectorizedN<float, VLEN> vb;
        at::vec::VectorizedN<float, ROWS*COLS> vc;
        auto loadc = [&](auto i) {
            if constexpr (accum) {
                constexpr int row = i / COLS;
                constexpr int col = i % COLS;
                vc[i] = Vectorized::loadu(C + row * ldc + col * VLEN);
            } else {
                vc[i] = Vectorized(0.0f);
            }
        };
        c10::ForcedUnroll<ROWS * COLS>{}(loadc);
        auto unroll_loadB = [&](auto i, const float* __restrict__ src_ptr) {
            vb[i] = Vectorized::loadu(src_ptr + i * ldb, VLEN);
        };
        auto compute_trans = [&, COLS](auto i, int k) {
            constexpr int row = i % ROWS;
            constexpr int col = i / ROWS;
            constexpr int e_col = col * VLEN;
            int idk = k * VLEN;
            if constexpr (row == 0) {
                c10::ForcedUnroll<VLEN>{}(unroll_loadB, B + e_col * ldb + idk);
                at::vec::transpose_block(vb);
            }
            constexpr int idx = row * COLS + col;
            #pragma GCC unroll 16
            for (int j = 0; j < VLEN; j++) {
                va = Vectorized(static_cast<float>(A[row * lda + idk + j]));
                vc[idx] = at::vec::fmadd(va, vb[j], vc[idx]);
            }
        };
        for (int k = 0; k < _K; ++k) {
            c10::ForcedUnroll<ROWS * COLS>{}(compute_trans, k);
        }
        // store to C
        auto storec = [&](auto i) {
            constexpr int row = i / COLS;
            constexpr int col = i % COLS;
            vc[i].store(C + row * ldc + col * VLEN);
        };
        c10::ForcedUnroll<ROWS * COLS>{}(storec);
    } else {
        // Second implementation
        constexpr auto VLEN = Vectorized::size();
        int _K = (K + VLEN - 1) / VLEN;
        // sub-block size of BLOCK_N and BLOCK_M
        constexpr int sM = 1;
        constexpr int sN = 4;
        int bN = (N + sN - 1) / sN;
        constexpr int bM = (BLOCK_M + sM - 1) / sM;
        at::vec::Vectorized<float> va;
        at::vec::VectorizedN<float, sN> vb;
        at::vec::VectorizedN<float, sN * sM> vmid;
        int ntail = N % sN;
        constexpr int mtail = BLOCK_M % sM;
        int ktail = K % VLEN;

        auto compute_trans = [&](int m, int n, int k) {
            int e_n = (n == bN - 1 && ntail != 0) ? (N - n * sN) : sN;
            int e_m = (m == bM - 1 && mtail != 0) ? (BLOCK_M - m * sM) : sM;
            int e_k = (k == _K - 1 && ktail != 0) ? (K - k * VLEN) : VLEN;
            #pragma GCC unroll 4
            for (int i = 0; i < e_n; i++) {
                vb[i] = Vectorized::loadu(B + (sN * n + i) * ldb + k * VLEN, e_k);
            }

            #pragma GCC unroll 1
            for (int s = 0; s < e_m; s++) {
                va = Vectorized::loadu(A + (sM * m + s) * lda + k * VLEN, e_k);
                if (k == 0) {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        vmid[sN * s + i] = at::vec::fmadd(va, vb[i], Vectorized(0.0f));
                    }
                } else {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        vmid[sN * s + i] = at::vec::fmadd(va, vb[i], vmid[sN * s + i]);
                    }
                }
            }

            // store to C
            if (k == _K - 1) {
                #pragma GCC unroll 1
                for (int s = 0; s < e_m; s++) {
                    #pragma GCC unroll 4
                    for (int i = 0; i < e_n; i++) {
                        auto v = at::vec::vec_reduce_all([](Vectorized& x, Vectorized& y) { return x + y; }, vmid[sN * s + i]);
                        if constexpr (accum) {
                            auto c = *(C + (sM * m + s) * ldc + sN * n + i);
                            *(C + (sM * m + s) * ldc + sN * n + i) = c + v;
                        } else {
                            *(C + (sM * m + s) * ldc + sN * n + i) = v;
                        }
                    }
                }
            }
        };

        for (int n = 0; n < bN; ++n) {
            for (int m = 0; m < bM; ++m) {
                for (int k = 0; k < _K; ++k) {
                    compute_trans(m, n, k);
                }
            }
        }
    }
}

template <bool accum, bool prefetch=false>
inline void kernel_kernel_micro_gemm_transpose_b(
    const float* __restrict__ A,
    const float* __restrict__ B,
    float* __restrict__ C,
    int64_t M,
    int64_t N,
    int64_t K,
    int64_t lda,
    int64_t ldb,
    int64_t ldc
) {
    using Vectorized = at::vec::Vectorized<float>;
    constexpr auto VLEN = Vectorized::size();
    TORCH_CHECK(16 % VLEN == 0, "block_n dimension must be multiple of Vector size");
    TORCH_CHECK(K % 1 == 0, "K dimension must be multiple of 1");
    // TODO(jgong5): loop unroll for M and N
    for (int64_t m = 0; m < M; m += 1) {
        int64_t block_m = std::min<int64_t>(M - m, 1);
        for (int64_t n = 0; n < N; n += 16) {
            int64_t block_n = std::min<int64_t>(N - n, 16);
            if (block_m == 1 && block_n == 16) {
                kernel_kernel_micro_gemm_transpose_b_transpose_b_kernel<1, 16, accum, prefetch>(
                    A + m * lda,
                    B + n * ldb,
                    C + m * ldc + n,
                    K,
                    lda,
                    ldb,
                    ldc
                );
            } else if (block_n == 16){
                switch (block_m) {
                default:
                    TORCH_CHECK(false, "Unsupported block_m: 1");
                }
            } else {
                switch (block_m) {
                case 1:
                    kernel_kernel_micro_gemm_transpose_b_ntail_transpose_b_kernel<1, 16, accum, prefetch>(
                        A + m * lda,
                        B + n * ldb,
                        C + m * ldc + n,
                        block_n,
                        K,
                        lda,
                        ldb,
                        ldc
                    );
                    break;
                default:
                    TORCH_CHECK(false, "Unsupported block_m: 1");
                }
            }
        }
    }
}

// 1) out = exp(a - val)
// 2) val = sum(out)
template <typename T1, typename T2>
inline void kernel_exp_reduce_sum_fusion_kernel(
    T1* a,
    const int& size,
    T2* out,
    T1& val) {
  auto vec_size = at::vec::Vectorized<T1>::size();
  auto vec_max = at::vec::Vectorized<T1>(val);
  T1 tmp_sum = 0;
  auto vec_tmp_sum = at::vec::Vectorized<T1>(tmp_sum);
  for (long i = 0; i < vec_size * (size / vec_size); i += vec_size) {
    auto tmp0 = at::vec::Vectorized<T1>::loadu(a + i);
    auto tmp1 = tmp0 - vec_max;
    auto tmp2 = tmp1.exp_u20();
    vec_tmp_sum += tmp2;
    at::native::_store(out + i, tmp2);
  }
  tmp_sum = at::vec::vec_reduce_all<T1>(
      [](at::vec::Vectorized<T1>& x, at::vec::Vectorized<T1>& y) {
        return x + y;
      },
      vec_tmp_sum);
  for (long i = vec_size * (size / vec_size); i < size; i++) {
    auto tmp0 = a[i];
    auto tmp1 = tmp0 - val;
    auto tmp2 = exp(tmp1);
    tmp_sum += tmp2;
    out[i] = tmp2;
  }
  val = tmp_sum;
}

// 1) out = a * scale
// 2) max = max(out)
template <typename scalar_t>
inline void kernel_mul_reduce_max_fusion_kernel(
    const scalar_t* a,
    const scalar_t& scale,
    const int& size,
    scalar_t* out,
    scalar_t& max) {
  auto vec_size = at::vec::Vectorized<scalar_t>::size();
  auto vec_scale = at::vec::Vectorized<scalar_t>(scale);
  scalar_t tmp_max = -std::numeric_limits<scalar_t>::infinity();
  auto vec_tmp_max = at::vec::Vectorized<scalar_t>(tmp_max);
  for (long i = 0; i < vec_size * (size / vec_size); i += vec_size) {
    auto tmp0 = at::vec::Vectorized<scalar_t>::loadu(a + i);
    auto tmp1 = tmp0 * vec_scale;
    vec_tmp_max = at::vec::maximum(vec_tmp_max, tmp1);
    at::native::_store(out + i, tmp1);
  }
  for (long i = vec_size * (size / vec_size); i < size; i++) {
    auto tmp0 = a[i];
    auto tmp1 = tmp0 * scale;
    tmp_max = std::max(tmp_max, tmp1);
    out[i] = tmp1;
  }
  max = std::max(
      tmp_max,
      at::vec::vec_reduce_all<scalar_t>(
          [](at::vec::Vectorized<scalar_t>& x, at::vec::Vectorized<scalar_t>& y) {
            return at::vec::maximum(x, y);
          },
          vec_tmp_max));
}

template <typename scalar_t>
static inline scalar_t* kernel_conditional_data_ptr(scalar_t* ptr, scalar_t* ptr2) {
  TORCH_CHECK(ptr2 == nullptr);
  return ptr;
}

template <typename scalar_t,
          typename std::enable_if_t<c10::is_reduced_floating_point_v<scalar_t>, int> = 0>
static inline scalar_t* kernel_conditional_data_ptr(float* ptr, scalar_t* ptr2) {
  return ptr2;
}

template <typename scalar_t>
inline void kernel_fill_stub(scalar_t* data, scalar_t val, int64_t size) {
  using Vec = at::vec::Vectorized<scalar_t>;
  Vec data_vec = Vec(val);
  int64_t d = 0;
  for (; d < size - (size % Vec::size()); d += Vec::size()) {
    data_vec.store(data + d);
  }
  #if !defined(_MSC_VER) && !defined(COMPILING_FOR_MIN_SIZE)
  # pragma unroll
  #endif
  for (; d < size; d++) {
    data[d] = val;
  }
}

// out = a * scale
template <typename scalar_t>
inline void kernel_mul_scale_kernel(
    scalar_t* a,
    scalar_t scale,
    int64_t size) {
  auto vec_size = at::vec::Vectorized<scalar_t>::size();
  auto vec_scale = at::vec::Vectorized<scalar_t>(scale);
  for (int64_t i = 0; i < vec_size * (size / vec_size); i += vec_size) {
    auto tmp0 = at::vec::Vectorized<scalar_t>::loadu(a + i);
    auto tmp1 = tmp0 * vec_scale;
    at::native::_store(a + i, tmp1);
  }
  for (int64_t i = vec_size * (size / vec_size); i < size; i++) {
    auto tmp0 = a[i];
    auto tmp1 = tmp0 * scale;
    a[i] = tmp1;
  }
}


template <typename scalar_t>
inline void kernel_copy_value_with_pad(
    const scalar_t* value_ptr,
    scalar_t* dst_ptr,
    int64_t rows,
    int64_t cols,
    int64_t prows,
    int64_t pcols,
    int64_t ldi) {
  auto vec_size = at::vec::Vectorized<scalar_t>::size();
  int64_t i = 0;
  for (; i < rows; i++) {
    int64_t j = 0;
    for (; j < cols - (cols % vec_size); j += vec_size) {
      auto vec_v =
          at::vec::Vectorized<scalar_t>::loadu(value_ptr + i * ldi + j);
      vec_v.store(dst_ptr + i * pcols + j);
    }

    if (j < cols) {
      auto vec_v = at::vec::Vectorized<scalar_t>::loadu(
          value_ptr + i * ldi + j, cols - j);
      vec_v.store(dst_ptr + i * pcols + j, cols - j);
    }

    // col padding
    auto psize = pcols - cols;
    if (psize > 0) {
      auto zero_vec = at::vec::Vectorized<scalar_t>(0);
      int64_t pj = 0;
      for (; pj < psize - (psize % vec_size); pj += vec_size) {
        zero_vec.store(dst_ptr + i * pcols + cols + pj);
      }
      if (pj < psize) {
        zero_vec.store(dst_ptr + i * pcols + cols + pj, psize - pj);
      }
    }
  }
  // row padding
  for (; i < prows; i++) {
    auto zero_vec = at::vec::Vectorized<scalar_t>(0);
    int64_t j = 0;
    for (; j < pcols - (pcols % vec_size); j += vec_size) {
      zero_vec.store(dst_ptr + i * pcols + j);
    }
    if (j < pcols) {
      zero_vec.store(dst_ptr + i * pcols + j, pcols - j);
    }

  }
}

extern "C"
void kernel(const float* query, const float* key, const float* value, const int32_t* kv_num_blocks, const int32_t* kv_indices, const bool* score_others_0, const float* score_others_1, float* output)
{


  // dtypes
  using scalar_t = float;
  constexpr bool is_reduced_type = c10::is_reduced_floating_point_v<scalar_t>;
  using accum_t = at::opmath_type<float>;
  using Vec = at::vec::Vectorized<accum_t>;
  accum_t scaling_factor = 0.5;

  // sizes
  int64_t qBlockSize = 1073741824;
  int64_t kvBlockSize = 1073741824;
  int64_t num_thread = 2;
  int64_t batchSize = static_cast<int64_t>(2L);
  int64_t qSize = static_cast<int64_t>(5L);
  int64_t num_head = static_cast<int64_t>(2L);
  int64_t headSize = static_cast<int64_t>(4L);
  int64_t batchSize_k = static_cast<int64_t>(2L);
  int64_t num_head_k = static_cast<int64_t>(2L);
  int64_t headSize_v = static_cast<int64_t>(4L);
  bool is_broadcast_bs_kv = batchSize != batchSize_k;
  bool is_broadcast_head_kv = num_head != num_head_k;
  int64_t gqa_shards = num_head / num_head_k;
  int64_t bs_shards = batchSize / batchSize_k;

  int64_t batchSize_kvi = static_cast<int64_t>(1L);
  int64_t num_head_kvi = static_cast<int64_t>(1L);
  int64_t block_num_kvi = static_cast<int64_t>(1L);
  bool is_broadcast_bs_kvi = batchSize != batchSize_kvi;
  bool is_broadcast_head_kvi = num_head != num_head_kvi;
  int64_t gqa_shards_kvi = num_head / num_head_kvi;
  int64_t bs_shards_kvi = batchSize / batchSize_kvi;

  int64_t kvSize = static_cast<int64_t>(7L);

  int64_t qSplitSize = qBlockSize;
  int64_t kvSplitSize = kvBlockSize;

  qSplitSize = qSplitSize > qSize ? qSize : qSplitSize;
  kvSplitSize = kvSplitSize > kvSize ? kvSize : kvSplitSize;
  int64_t qSlice = (qSize + qSplitSize - 1) / qSplitSize;
  int64_t kvSlice = (kvSize + kvSplitSize - 1) / kvSplitSize;
  int64_t kvTail = (kvSize - 1) % kvSplitSize + 1;

  // Strides
  int64_t kviStrideB = static_cast<int64_t>(1L);
  int64_t kviStrideH = static_cast<int64_t>(1L);
  int64_t kviStrideQ = static_cast<int64_t>(1L);

  int64_t num_kviStrideB = static_cast<int64_t>(1L);
  int64_t num_kviStrideH = static_cast<int64_t>(1L);

  auto kv_num_blocks_data = kv_num_blocks;
  auto kv_indices_data = kv_indices;

  int64_t qStrideB = static_cast<int64_t>(40L);
  int64_t qStrideM = static_cast<int64_t>(8L);
  int64_t qStrideH = static_cast<int64_t>(4L);
  int64_t kStrideB = static_cast<int64_t>(56L);
  int64_t kStrideN = static_cast<int64_t>(8L);
  int64_t kStrideH = static_cast<int64_t>(4L);
  int64_t vStrideB = static_cast<int64_t>(56L);
  int64_t vStrideN = static_cast<int64_t>(8L);
  int64_t vStrideH = static_cast<int64_t>(4L);
  int64_t oStrideB = static_cast<int64_t>(40L);
  int64_t oStrideM = static_cast<int64_t>(8L);
  int64_t oStrideH = static_cast<int64_t>(4L);

  // Inputs/outputs buffers
  const scalar_t* q_data = query;
  const scalar_t* k_data = key;
  const scalar_t* v_data = value;
  scalar_t* out_data = output;


  bool need_pack = false;
  // Whether pack is needed for BFloat16/Half
  if (is_reduced_type) {
    // check platform ability
    need_pack = std::is_same_v<scalar_t, at::BFloat16> ? at::native::cpublas::could_pack(at::kBFloat16)
                                                       : at::native::cpublas::could_pack(at::kHalf);
  }
  if (need_pack) {
    // When the number of gemm is greater than the number of pack,
    // the pack overhead can be overlapped.
    int64_t thresh_size = 64;
    need_pack = kvSize >= thresh_size && qSize >= thresh_size;
    if (need_pack) {
      double pack_size = batchSize * num_head * kvSize * headSize;
      double qs_per_thread = (batchSize * num_head * qSlice + num_thread - 1) / num_thread;
      double gemm_size_per_thread = qs_per_thread * qSplitSize * kvSize * headSize;
      need_pack = gemm_size_per_thread / pack_size >= 4;
    }
  }
  // Pad is needed for packing when K is not even
  bool headSize_even = headSize % 2 == 0;
  int64_t eheadSize = need_pack && !headSize_even ? headSize + 1: headSize;
  int64_t ekvSplitSize = need_pack && (kvSplitSize % 2 != 0) ? kvSplitSize + 1 : kvSplitSize;
  int64_t ekvTail = need_pack && (kvTail % 2 != 0) ? kvTail + 1 : kvTail;
  int64_t kv_padding_size = (kvSize - 1) / kvSplitSize * ekvSplitSize + ekvTail;

  // Allocate per thread temp buf (accumulate type)
  int64_t _size_per_thread =
      /* qk     */ qSplitSize * kvSplitSize +
      /* qk_max */ qSplitSize +
      /* qk_sum */ qSplitSize +
      /* dst    */ qSplitSize * headSize_v;

  // Buffers to store accum results, padding query and transpose/packing key/value

  int64_t buf_data_dtype_itemsize = c10::is_reduced_floating_point_v<accum_t> ? 2 : 4;
  auto& buf_data_allocator = *at::getCPUAllocator();
  auto buf_data_work_data = buf_data_allocator.allocate(num_thread*_size_per_thread*buf_data_dtype_itemsize);
  void* buf_data_data_ptr = buf_data_work_data.get();
  accum_t* buf_data = (accum_t*)buf_data_data_ptr;

  int64_t buf_reduced_data_dtype_itemsize = c10::is_reduced_floating_point_v<scalar_t> ? 2 : 4;
  auto& buf_reduced_data_allocator = *at::getCPUAllocator();
  auto buf_reduced_data_work_data = buf_reduced_data_allocator.allocate(num_thread*qSplitSize*ekvSplitSize*buf_reduced_data_dtype_itemsize);
  void* buf_reduced_data_data_ptr = buf_reduced_data_work_data.get();
  scalar_t* buf_reduced_data = (scalar_t*)buf_reduced_data_data_ptr;

  int64_t key_reorder_ptr_dtype_itemsize = c10::is_reduced_floating_point_v<scalar_t> ? 2 : 4;
  auto& key_reorder_ptr_allocator = *at::getCPUAllocator();
  auto key_reorder_ptr_work_data = key_reorder_ptr_allocator.allocate(batchSize_k*num_head_k*eheadSize*kvSize*key_reorder_ptr_dtype_itemsize);
  void* key_reorder_ptr_data_ptr = key_reorder_ptr_work_data.get();
  scalar_t* key_reorder_ptr = (scalar_t*)key_reorder_ptr_data_ptr;

  int64_t value_reorder_ptr_dtype_itemsize = c10::is_reduced_floating_point_v<scalar_t> ? 2 : 4;
  auto& value_reorder_ptr_allocator = *at::getCPUAllocator();
  auto value_reorder_ptr_work_data = value_reorder_ptr_allocator.allocate(batchSize_k*num_head_k*kv_padding_size*headSize_v*value_reorder_ptr_dtype_itemsize);
  void* value_reorder_ptr_data_ptr = value_reorder_ptr_work_data.get();
  scalar_t* value_reorder_ptr = (scalar_t*)value_reorder_ptr_data_ptr;

  int64_t transpose_buffer_ptr_dtype_itemsize = c10::is_reduced_floating_point_v<scalar_t> ? 2 : 4;
  auto& transpose_buffer_ptr_allocator = *at::getCPUAllocator();
  auto transpose_buffer_ptr_work_data = transpose_buffer_ptr_allocator.allocate(num_thread*kvSplitSize*headSize*transpose_buffer_ptr_dtype_itemsize);
  void* transpose_buffer_ptr_data_ptr = transpose_buffer_ptr_work_data.get();
  scalar_t* transpose_buffer_ptr = (scalar_t*)transpose_buffer_ptr_data_ptr;

  int64_t query_padding_ptr_dtype_itemsize = c10::is_reduced_floating_point_v<scalar_t> ? 2 : 4;
  auto& query_padding_ptr_allocator = *at::getCPUAllocator();
  auto query_padding_ptr_work_data = query_padding_ptr_allocator.allocate(num_thread*qSplitSize*eheadSize*query_padding_ptr_dtype_itemsize);
  void* query_padding_ptr_data_ptr = query_padding_ptr_work_data.get();
  scalar_t* query_padding_ptr = (scalar_t*)query_padding_ptr_data_ptr;
  if (need_pack) {
    // Pack K, V
    at::parallel_for(0, batchSize_k * num_head_k * kvSlice, 1, [&](int64_t begin, int64_t end) {
      int ompIdx = at::get_thread_num();
      int64_t i = 0, j = 0, l = 0, n = 0;
      scalar_t* transpose_ptr = need_pack? transpose_buffer_ptr + ompIdx * kvSplitSize * headSize : nullptr;
      at::native::data_index_init(begin, i, batchSize_k, j, num_head_k, l, kvSlice);
      for ([[maybe_unused]] auto z : c10::irange(begin, end)) {
        n = l * kvSplitSize;
        int64_t cur_kvSplitSize = std::min(kvSplitSize, kvSize - n);
        auto k_addr =
              k_data + i * kStrideB + j * kStrideH + n * kStrideN;
        auto v_addr =
              v_data + i * vStrideB + j * vStrideH + n * vStrideN;
        // transpose [cur_kvSplitSize, headSize] -> [headSize, cur_kvSplitSize]
        at::native::utils::transpose<uint16_t>(
          cur_kvSplitSize,
          headSize,
          /* src_ptr */
          reinterpret_cast<const uint16_t*>(k_addr),
          /* ld_src */ kStrideN,
          /* dst */ reinterpret_cast<uint16_t*>(transpose_ptr),
          /* ld_dst */ cur_kvSplitSize);

        // Pack [headSize, cur_kvSplitSize]
        at::vec::pack_vnni2(
          /* src */ reinterpret_cast<const uint16_t*>(transpose_ptr),
          /* dst */ reinterpret_cast<uint16_t*>(key_reorder_ptr + i * num_head_k * eheadSize * kvSize +
                  j * eheadSize * kvSize + n * eheadSize),
          /* ld_src */ cur_kvSplitSize,
          /* K */ headSize,
          /* N */ cur_kvSplitSize);

        // Pack [cur_kvSplitSize, headSize_v]
        at::vec::pack_vnni2(
          /* src */ reinterpret_cast<const uint16_t*>(v_addr),
          /* dst */ reinterpret_cast<uint16_t*>(value_reorder_ptr +
                  i * num_head_k * kv_padding_size * headSize_v +
                  j * kv_padding_size * headSize_v + n * headSize_v),
          /* ld_src */ vStrideN,
          /* K */ cur_kvSplitSize,
          /* N */ headSize_v);
      // Move to the next query
      at::native::data_index_step(i, batchSize_k, j, num_head_k, l, kvSlice);
      }
    });
  }
  // Attention loop below
  at::parallel_for(0, batchSize * num_head * qSlice, 1, [&](int64_t begin, int64_t end) {
    int64_t i = 0, j = 0, k = 0;
    at::native::data_index_init(begin, i, batchSize, j, num_head, k, qSlice);
    int ompIdx = at::get_thread_num();
    accum_t* buf_ptr = buf_data + ompIdx * _size_per_thread;
    accum_t* qk_data = buf_ptr;
    accum_t* qk_max_data = qk_data + qSplitSize * kvSplitSize;
    accum_t* qk_sum_data = qk_max_data + qSplitSize;
    accum_t* dst_data = qk_sum_data + qSplitSize;
    scalar_t *qk_reduced_data =
        is_reduced_type
            ? buf_reduced_data + ompIdx * qSplitSize * ekvSplitSize
            : nullptr;
    scalar_t* query_t_padding_ptr = (!headSize_even && need_pack)
            ? query_padding_ptr + ompIdx * qSplitSize * eheadSize
            : nullptr;

    for ([[maybe_unused]] auto z : c10::irange(begin, end)) {
      auto i_kvi = is_broadcast_bs_kvi ? i/bs_shards_kvi : i;
      auto j_kvi = is_broadcast_head_kvi ? j/gqa_shards_kvi : j;
      auto kv_logical_num_data = kv_num_blocks_data + i_kvi * num_kviStrideB +
                              j_kvi * num_kviStrideH + k;
      int kv_indice_num = *kv_logical_num_data;
      std::vector<int> kv_indice_list(kv_indice_num);
      for(int kv_i = 0; kv_i < kv_indice_num; kv_i++){
        auto kv_logical_data = kv_indices_data + i_kvi * kviStrideB +
                                  j_kvi * kviStrideH + k*kviStrideQ + kv_i;
        kv_indice_list[kv_i] = *kv_logical_data;
      }
      bool is_skip_kv = kv_indice_num > 0 ? false : true;
      int64_t m = k * qSplitSize;
      int64_t cur_qSplitSize = std::min(qSplitSize, qSize - m);
      if (!is_skip_kv){
        // Initialize max and sum
        kernel_fill_stub(qk_max_data,
            -std::numeric_limits<accum_t>::infinity(), cur_qSplitSize);
        kernel_fill_stub(qk_sum_data,
            static_cast<accum_t>(0), cur_qSplitSize);

        if (!headSize_even && need_pack) {
          // Pad query if headSize is not even
          kernel_copy_value_with_pad<scalar_t>(
            q_data + i * qStrideB + j * qStrideH + m * qStrideM,
            query_t_padding_ptr,
            cur_qSplitSize,
            headSize,
            cur_qSplitSize,
            eheadSize,
            qStrideM
          );
        }
      }
      for (int64_t n_idx = 0; n_idx < kv_indice_num ; n_idx += 1) {
        auto n = kv_indice_list[n_idx]*kvSplitSize;

        auto cur_n = n/kvSplitSize;
        int64_t cur_kvSplitSize = std::min(kvSplitSize, kvSize - n);
        int64_t cur_ekvSplitSize = (need_pack && cur_kvSplitSize % 2 != 0) ? cur_kvSplitSize + 1 : cur_kvSplitSize;

        // Calculate scale * q @ k.T
        auto i_kv = is_broadcast_bs_kv ? i/bs_shards : i;
        auto j_kv = is_broadcast_head_kv ? j/gqa_shards : j;

        if (!need_pack) {
          auto k_addr =
              k_data + i_kv * kStrideB + j_kv * kStrideH + n * kStrideN;

          kernel_kernel_micro_gemm_transpose_b<static_cast<bool>(false)>(
              q_data + i * qStrideB + j * qStrideH +
                  m * qStrideM,
              k_addr,
              qk_data,
              cur_qSplitSize,
              cur_kvSplitSize,
              headSize,
              qStrideM,
              kStrideN,
              cur_kvSplitSize);

        } else {
          at::native::cpublas::brgemm(
              cur_qSplitSize,
              cur_kvSplitSize,
              eheadSize,
              headSize_even ? qStrideM : eheadSize,
              cur_kvSplitSize,
              cur_kvSplitSize,
              false,
              !headSize_even
                  ? query_t_padding_ptr
                  : q_data + i * qStrideB + j * qStrideH + m * qStrideM,
              key_reorder_ptr + i_kv * num_head_k * eheadSize * kvSize +
                  j_kv * eheadSize * kvSize + n * eheadSize,
              qk_data,
              need_pack);
        }

        kernel_mul_scale_kernel<accum_t>(qk_data, scaling_factor, cur_qSplitSize*cur_kvSplitSize);
        // TODO: reduce the number of calls of q_idx and kv_idx initialization
        std::vector<int64_t> q_idx(cur_qSplitSize);
        for (int64_t i = 0; i < cur_qSplitSize; ++i) {
          q_idx[i] = m + i;
        }

        std::vector<int64_t> kv_idx(cur_kvSplitSize);
        for (int64_t i = 0; i < cur_kvSplitSize; ++i) {
          kv_idx[i] = n + i;
        }

        std::vector<int64_t> b_idx = {i};
        std::vector<int64_t> h_idx = {j};

        accum_t* in_ptr0 = qk_data;

        auto in_ptr1 = b_idx.data();
        auto in_ptr2 = h_idx.data();
        auto in_ptr3 = q_idx.data();
        auto in_ptr4 = kv_idx.data();

        // apply score mod function
        {
            auto in_ptr5 = score_others_0;
auto in_ptr6 = score_others_1;
            accum_t* out_ptr9 = in_ptr0;
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(cur_qSplitSize); x0+=static_cast<int64_t>(1L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(cur_kvSplitSize); x1+=static_cast<int64_t>(8L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(8L*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L))))))
                            {
                                auto tmp0 = in_ptr1[static_cast<int64_t>(0L)];
                                auto tmp7 = in_ptr3[static_cast<int64_t>(x0)];
                                auto tmp11 = at::vec::VectorizedN<int64_t,2>::loadu(in_ptr4 + static_cast<int64_t>(x1), static_cast<int64_t>(8));
                                auto tmp25 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0), static_cast<int64_t>(8));
                                auto tmp1 = static_cast<int64_t>(1);
                                auto tmp2 = int64_t(tmp0 * tmp1);
                                auto tmp3 = static_cast<int64_t>(0);
                                auto tmp4 = int64_t(tmp2 + tmp3);
                                auto tmp5 = static_cast<int64_t>(5);
                                auto tmp6 = int64_t(tmp4 * tmp5);
                                auto tmp8 = int64_t(tmp6 + tmp7);
                                auto tmp9 = static_cast<int64_t>(7);
                                auto tmp10 = int64_t(tmp8 * tmp9);
                                auto tmp12 = at::vec::VectorizedN<int64_t,2>(tmp10);
                                auto tmp13 = tmp12 + tmp11;
                                auto tmp14 = 70L;
                                auto tmp15 = c10::convert<int64_t>(tmp14);
                                auto tmp16 = at::vec::VectorizedN<int64_t,2>(tmp15);
                                auto tmp17 = tmp13 + tmp16;
                                auto tmp18 = at::vec::VectorizedN<int64_t,2>(tmp3);
                                auto tmp19 = at::vec::VecMask<int64_t,2>(tmp13 < tmp18);
                                auto tmp20 = decltype(tmp17)::blendv(tmp13, tmp17, tmp19.template cast<int64_t,2>());
                                auto tmp21 =
                                [&]
                                {
                                    __at_align__ std::array<int64_t, 8> tmpbuf;
                                    tmp20.store(tmpbuf.data(), static_cast<int64_t>(8));
                                    return tmpbuf;
                                }
                                ()
                                ;
                                auto tmp22 =
                                [&]
                                {
                                    __at_align__ std::array<int64_t, 8> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(8); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = static_cast<int64_t>(tmp21[x1_inner]);
                                    }
                                    return at::vec::VectorizedN<int64_t,2>::loadu(tmpbuf.data(), static_cast<int64_t>(8));
                                }
                                ()
                                ;
                                TORCH_CHECK((at::vec::VecMask<int64_t,2>((at::vec::VectorizedN<int64_t,2>(0) <= tmp22) & (tmp22 < at::vec::VectorizedN<int64_t,2>(70L)))).all_masked(), "index out of bounds: 0 <= tmp22 < 70L");
                                auto tmp24 =
                                [&]
                                {
                                    __at_align__ std::array<bool, 32> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(8); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = in_ptr5[static_cast<int64_t>(tmp21[x1_inner])];
                                    }
                                    return at::vec::VecMask<float,1>::from(tmpbuf.data(), static_cast<int64_t>(8));
                                }
                                ()
                                ;
                                auto tmp26 =
                                [&]
                                {
                                    __at_align__ std::array<float, 8> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(8); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = in_ptr6[static_cast<int64_t>(tmp21[x1_inner])];
                                    }
                                    return at::vec::Vectorized<float>::loadu(tmpbuf.data(), static_cast<int64_t>(8));
                                }
                                ()
                                ;
                                auto tmp27 = tmp25 + tmp26;
                                auto tmp28 = -std::numeric_limits<float>::infinity();
                                auto tmp29 = at::vec::Vectorized<float>(tmp28);
                                auto tmp30 = decltype(tmp27)::blendv(tmp29, tmp27, tmp24.template cast<float,1>());
                                tmp30.store(out_ptr9 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0));
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(8L*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))) && x1 < static_cast<int64_t>(cur_kvSplitSize)))
                            {
                                auto tmp0 = in_ptr1[static_cast<int64_t>(0L)];
                                auto tmp7 = in_ptr3[static_cast<int64_t>(x0)];
                                auto tmp11 = at::vec::VectorizedN<int64_t,2>::loadu(in_ptr4 + static_cast<int64_t>(x1), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                auto tmp25 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                auto tmp1 = static_cast<int64_t>(1);
                                auto tmp2 = int64_t(tmp0 * tmp1);
                                auto tmp3 = static_cast<int64_t>(0);
                                auto tmp4 = int64_t(tmp2 + tmp3);
                                auto tmp5 = static_cast<int64_t>(5);
                                auto tmp6 = int64_t(tmp4 * tmp5);
                                auto tmp8 = int64_t(tmp6 + tmp7);
                                auto tmp9 = static_cast<int64_t>(7);
                                auto tmp10 = int64_t(tmp8 * tmp9);
                                auto tmp12 = at::vec::VectorizedN<int64_t,2>(tmp10);
                                auto tmp13 = tmp12 + tmp11;
                                auto tmp14 = 70L;
                                auto tmp15 = c10::convert<int64_t>(tmp14);
                                auto tmp16 = at::vec::VectorizedN<int64_t,2>(tmp15);
                                auto tmp17 = tmp13 + tmp16;
                                auto tmp18 = at::vec::VectorizedN<int64_t,2>(tmp3);
                                auto tmp19 = at::vec::VecMask<int64_t,2>(tmp13 < tmp18);
                                auto tmp20 = decltype(tmp17)::blendv(tmp13, tmp17, tmp19.template cast<int64_t,2>());
                                auto tmp21 =
                                [&]
                                {
                                    __at_align__ std::array<int64_t, 8> tmpbuf;
                                    tmp20.store(tmpbuf.data(), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                    return tmpbuf;
                                }
                                ()
                                ;
                                auto tmp22 =
                                [&]
                                {
                                    __at_align__ std::array<int64_t, 8> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = static_cast<int64_t>(tmp21[x1_inner]);
                                    }
                                    return at::vec::VectorizedN<int64_t,2>::loadu(tmpbuf.data(), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                }
                                ()
                                ;
                                TORCH_CHECK((at::vec::VecMask<int64_t,2>::set(at::vec::VecMask<int64_t,2>::from(1), (at::vec::VecMask<int64_t,2>((at::vec::VectorizedN<int64_t,2>(0) <= tmp22) & (tmp22 < at::vec::VectorizedN<int64_t,2>(70L)))), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))))).all_masked(), "index out of bounds: 0 <= tmp22 < 70L");
                                auto tmp24 =
                                [&]
                                {
                                    __at_align__ std::array<bool, 32> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = in_ptr5[static_cast<int64_t>(tmp21[x1_inner])];
                                    }
                                    return at::vec::VecMask<float,1>::from(tmpbuf.data(), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                }
                                ()
                                ;
                                auto tmp26 =
                                [&]
                                {
                                    __at_align__ std::array<float, 8> tmpbuf;
                                    #pragma GCC unroll 8
                                    for (long x1_inner = 0; x1_inner < static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))); x1_inner++)
                                    {
                                        tmpbuf[x1_inner] = in_ptr6[static_cast<int64_t>(tmp21[x1_inner])];
                                    }
                                    return at::vec::Vectorized<float>::loadu(tmpbuf.data(), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                                }
                                ()
                                ;
                                auto tmp27 = tmp25 + tmp26;
                                auto tmp28 = -std::numeric_limits<float>::infinity();
                                auto tmp29 = at::vec::Vectorized<float>(tmp28);
                                auto tmp30 = decltype(tmp27)::blendv(tmp29, tmp27, tmp24.template cast<float,1>());
                                tmp30.store(out_ptr9 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0), static_cast<int64_t>(cur_kvSplitSize + (-8L)*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))));
                            }
                        }
                    }
                }
            }

        }

        if ((std::find(kv_indice_list.begin(), kv_indice_list.end(), cur_n) != kv_indice_list.end()) ){
          // Apply block mask, fill unused with -inf
          {
              auto in_ptr5 = score_others_0;
auto in_ptr6 = score_others_1;
              accum_t* out_ptr10 = in_ptr0;
              {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(cur_qSplitSize); x0+=static_cast<int64_t>(1L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(cur_kvSplitSize); x1+=static_cast<int64_t>(8L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(8L*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L))))))
                            {
                                auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0), static_cast<int64_t>(8));
                                auto tmp1 = static_cast<bool>(true);
                                auto tmp2 = -std::numeric_limits<float>::infinity();
                                auto tmp3 = at::vec::VecMask<float,1>::from(tmp1);
                                auto tmp4 = at::vec::Vectorized<float>(tmp2);
                                auto tmp5 = decltype(tmp0)::blendv(tmp4, tmp0, tmp3.template cast<float,1>());
                                tmp5.store(out_ptr10 + static_cast<int64_t>(x1 + cur_kvSplitSize*x0));
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(8L*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L)))) && x1 < static_cast<int64_t>(cur_kvSplitSize)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(8L*(c10::div_floor_integer(static_cast<int64_t>(cur_kvSplitSize), static_cast<int64_t>(8L))));x1_tail < static_cast<int64_t>(cur_kvSplitSize); x1_tail++)
                                {
                                    auto tmp0 = in_ptr0[static_cast<int64_t>(x1_tail + cur_kvSplitSize*x0)];
                                    auto tmp1 = static_cast<bool>(true);
                                    auto tmp2 = -std::numeric_limits<float>::infinity();
                                    auto tmp3 = tmp1 ? tmp0 : tmp2;
                                    out_ptr10[static_cast<int64_t>(x1_tail + cur_kvSplitSize*x0)] = tmp3;
                                }
                            }
                        }
                    }
                }
            }

          }
        }
        // Update coefficients with Softmax
        accum_t tmp_max = 0, tmp_sum = 0, exp_tmp = 0;
        for (int64_t row = 0; row < cur_qSplitSize; ++row) {
          // apply scaling factor and max per row in fusion
          kernel_mul_reduce_max_fusion_kernel(
              qk_data + row * cur_kvSplitSize,
              static_cast<accum_t>(1),
              cur_kvSplitSize,
              qk_data + row * cur_kvSplitSize,
              tmp_max);
          tmp_max = qk_max_data[row] > tmp_max ? qk_max_data[row] : tmp_max;
          if (tmp_max == -std::numeric_limits<accum_t>::infinity()) {
            // to avoid `nan = exp2f(-inf - (-inf))`
            kernel_fill_stub(
              kernel_conditional_data_ptr(qk_data, qk_reduced_data) + row * cur_ekvSplitSize,
              static_cast<scalar_t>(0), cur_kvSplitSize);
          } else {
            tmp_sum = tmp_max;
            // qk <- exp(qk - max) and sum per row
            kernel_exp_reduce_sum_fusion_kernel(
              qk_data + row * cur_kvSplitSize, cur_kvSplitSize,
              kernel_conditional_data_ptr(qk_data, qk_reduced_data) + row * cur_ekvSplitSize,
              tmp_sum);
            // exp_tmp <- exp(max[row] - max)
            exp_tmp = std::exp(qk_max_data[row] - tmp_max);
            // sum[row] <- sum + exp_tmp * sum[row]
            qk_sum_data[row] = tmp_sum + exp_tmp * qk_sum_data[row];
            // max[row] <- max
            qk_max_data[row] = tmp_max;
            // dst <- dst * exp_tmp
            if (n_idx > 0) {
              at::vec::map<accum_t>(
              [exp_tmp](Vec x) { return x * Vec(exp_tmp); },
              dst_data + row * headSize_v,
              dst_data + row * headSize_v,
              headSize_v);
            }
          }
          if (need_pack && cur_kvSplitSize % 2 != 0) {
            // Pad: [qSplitSize, cur_kvSplitSize] -> [qSplitSize, cur_kvSplitSize + 1]
            *(qk_reduced_data + row * (1 + cur_kvSplitSize) + cur_kvSplitSize) = scalar_t(0);
          }
        }
        // Calculate Softmax(q @ k.T) @ v
        if (!need_pack) {
          auto v_addr =
              v_data + i_kv * vStrideB + j_kv * vStrideH + n * vStrideN;
          // Fallback Half brgemm is slower than micro gemm
          if (!std::is_same_v<scalar_t, at::Half>) {
            at::native::cpublas::brgemm(
                  cur_qSplitSize,
                  headSize_v,
                  cur_ekvSplitSize,
                  cur_ekvSplitSize,
                  vStrideN,
                  headSize_v,
                  n_idx > 0,
                  kernel_conditional_data_ptr(qk_data, qk_reduced_data),
                  v_addr,
                  dst_data,
                  need_pack);
          } else {
            if (n_idx > 0) {
              kernel_kernel_micro_gemm<static_cast<bool>(true)>(
                kernel_conditional_data_ptr(qk_data, qk_reduced_data),
                v_addr,
                dst_data,
                cur_qSplitSize,
                headSize_v,
                cur_ekvSplitSize,
                cur_ekvSplitSize,
                vStrideN,
                headSize_v);
            } else {
              kernel_kernel_micro_gemm<static_cast<bool>(false)>(
                kernel_conditional_data_ptr(qk_data, qk_reduced_data),
                v_addr,
                dst_data,
                cur_qSplitSize,
                headSize_v,
                cur_ekvSplitSize,
                cur_ekvSplitSize,
                vStrideN,
                headSize_v);
            }
          }
        } else {
          int64_t psize = n / kvSplitSize * ekvSplitSize;
          at::native::cpublas::brgemm(
              cur_qSplitSize,
              headSize_v,
              cur_ekvSplitSize,
              cur_ekvSplitSize,
              headSize_v,
              headSize_v,
              n_idx > 0,
              qk_reduced_data,
              value_reorder_ptr +
                  i_kv * num_head_k * kv_padding_size * headSize_v +
                  j_kv * kv_padding_size * headSize_v + psize * headSize_v,
              dst_data,
              need_pack);
        }
      }

      // dst <- dst / sum[row]
      // reorder MHA output with strides
      for (int64_t row = 0; row < cur_qSplitSize; ++row) {
        // Row sums for full masked out rows are 0, we set them to 1
        // in order to avoid NaNs in the output and instead set fully
        // masked out rows to 0
        qk_max_data[row] = qk_max_data[row] == -std::numeric_limits<accum_t>::infinity() ? 0 : qk_max_data[row];
        qk_sum_data[row] = qk_sum_data[row] == 0 ? 1 : qk_sum_data[row];
        accum_t sum_reciprocal = 1 / qk_sum_data[row];
        at::vec::map<scalar_t>(
            [sum_reciprocal, is_skip_kv](Vec x) { return  is_skip_kv ? Vec(0.0) : x * Vec(sum_reciprocal); },
            out_data + i * oStrideB + j * oStrideH + m * oStrideM + row * oStrideM,
            dst_data + row * headSize_v,
            headSize_v);
      }

      // Move to the next query
      at::native::data_index_step(i, batchSize, j, num_head, k, qSlice);
    }

    at::native::cpublas::brgemm_release(need_pack);

  });
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
        if(PyTuple_GET_SIZE(args) != 8) [[unlikely]]
            throw std::runtime_error("requires 8 args");
        kernel(parse_arg<float*>(args, 0), parse_arg<float*>(args, 1), parse_arg<float*>(args, 2), parse_arg<int32_t*>(args, 3), parse_arg<int32_t*>(args, 4), parse_arg<bool*>(args, 5), parse_arg<float*>(args, 6), parse_arg<float*>(args, 7)); Py_RETURN_NONE;
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
