//! The one product of the VAD engine and the speaker encoder: many dot products of weight rows
//! with input columns. On x86-64 with AVX2 and FMA it runs as 8-lane fused multiply-adds, 4 rows
//! against 2 columns at a time (8 independent sums); elsewhere as plain loops.
//!
//! Unsafe code, allowed here only: the intrinsics need CPU features checked at run time, and
//! their loads take raw pointers. The one entry point checks every length first.
#![allow(unsafe_code)]

/// Lanes of one accumulator: the row length must be a multiple of it.
pub const LANES: usize = 8;
/// Rows one pass over a column computes, reusing each load of the column.
const ROWS: usize = 4;

/// `out[j * m + r] = Σ_i rows[r * k + i] · columns[j * k + i]`: every row (`m` of them, `k`
/// long) against every column, `k` a multiple of [`LANES`].
///
/// # Panics
/// If `k` is not a multiple of [`LANES`], or the lengths do not agree.
pub fn dots(rows: &[f32], k: usize, columns: &[f32], out: &mut [f32]) {
    assert!(k > 0 && k.is_multiple_of(LANES), "row length {k}");
    assert!(rows.len().is_multiple_of(k) && columns.len().is_multiple_of(k));
    assert_eq!(out.len(), rows.len() / k * (columns.len() / k));
    #[cfg(target_arch = "x86_64")]
    if fma_available() {
        // SAFETY: the CPU has every feature `dots_fma` is compiled for, and the lengths agree
        // (asserted above), which is all its loads rely on.
        unsafe { dots_fma(rows, k, columns, out) };
        return;
    }
    body(rows, k, columns, out);
}

#[cfg(target_arch = "x86_64")]
fn fma_available() -> bool {
    use std::sync::OnceLock;
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_fma(rows: &[f32], k: usize, columns: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let m = rows.len() / k;
    let total = |v: __m256| {
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds the 8 floats stored.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        sum(lanes)
    };
    let blocks = m / ROWS;
    let n = columns.len() / k;
    for b in 0..blocks {
        let r = rows[b * ROWS * k..].as_ptr();
        // Two columns at a time: 8 independent sums keep both FMA units busy.
        let mut j = 0;
        while j + 2 <= n {
            let x = columns[j * k..].as_ptr();
            let mut acc = [_mm256_setzero_ps(); 2 * ROWS];
            let mut i = 0;
            while i < k {
                // SAFETY: i + 8 ≤ k; rows b·4..b·4 + 4 lie within `rows` (b < m / 4), and
                // columns j and j + 1 within `columns` (j + 2 ≤ n).
                unsafe {
                    let x0 = _mm256_loadu_ps(x.add(i));
                    let x1 = _mm256_loadu_ps(x.add(k + i));
                    for q in 0..ROWS {
                        let a = _mm256_loadu_ps(r.add(q * k + i));
                        acc[q] = _mm256_fmadd_ps(a, x0, acc[q]);
                        acc[ROWS + q] = _mm256_fmadd_ps(a, x1, acc[ROWS + q]);
                    }
                }
                i += LANES;
            }
            for (c, sums) in acc.chunks_exact(ROWS).enumerate() {
                let at = (j + c) * m + b * ROWS;
                for (o, &v) in out[at..at + ROWS].iter_mut().zip(sums) {
                    *o = total(v);
                }
            }
            j += 2;
        }
        if j < n {
            let x = columns[j * k..].as_ptr();
            let mut acc = [_mm256_setzero_ps(); ROWS];
            let mut i = 0;
            while i < k {
                // SAFETY: as above, for the last column alone.
                unsafe {
                    let x = _mm256_loadu_ps(x.add(i));
                    for (q, sum) in acc.iter_mut().enumerate() {
                        *sum = _mm256_fmadd_ps(_mm256_loadu_ps(r.add(q * k + i)), x, *sum);
                    }
                }
                i += LANES;
            }
            let at = j * m + b * ROWS;
            for (o, v) in out[at..at + ROWS].iter_mut().zip(acc) {
                *o = total(v);
            }
        }
    }
    for row in blocks * ROWS..m {
        let a = rows[row * k..].as_ptr();
        for (j, column) in columns.chunks_exact(k).enumerate() {
            let x = column.as_ptr();
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < k {
                // SAFETY: i + 8 ≤ k; the row and the column are k long.
                unsafe {
                    acc =
                        _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(x.add(i)), acc);
                }
                i += LANES;
            }
            out[j * m + row] = total(acc);
        }
    }
}

#[inline(always)]
fn sum(lanes: [f32; LANES]) -> f32 {
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + e) + (c + g)) + ((b + f) + (d + h))
}

/// The portable product: each row against each column.
fn body(rows: &[f32], k: usize, columns: &[f32], out: &mut [f32]) {
    let m = rows.len() / k;
    for (r, row) in rows.chunks_exact(k).enumerate() {
        let row = row.as_chunks::<LANES>().0;
        for (j, column) in columns.chunks_exact(k).enumerate() {
            let mut acc = [0.0f32; LANES];
            for (a, x) in row.iter().zip(column.as_chunks::<LANES>().0) {
                for l in 0..LANES {
                    acc[l] += a[l] * x[l];
                }
            }
            out[j * m + r] = sum(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_meets_every_column_including_the_rows_past_the_last_block() {
        // 7 rows (one block of 4 and 3 left over) of 16, 3 columns.
        let k = 16;
        let rows: Vec<f32> = (0..7 * k).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let columns: Vec<f32> = (0..3 * k).map(|i| ((i * 13) % 7) as f32 - 3.0).collect();
        let mut out = vec![0.0; 7 * 3];
        dots(&rows, k, &columns, &mut out);
        for j in 0..3 {
            for r in 0..7 {
                let want: f32 = (0..k).map(|i| rows[r * k + i] * columns[j * k + i]).sum();
                assert_eq!(out[j * 7 + r], want, "row {r}, column {j}");
            }
        }
        let mut portable = vec![0.0; 7 * 3];
        body(&rows, k, &columns, &mut portable);
        assert_eq!(out, portable);
    }
}
