//! Integer matrix products for quantised models: `u8` activations times `i8` (or `u8`)
//! operands, accumulated in `i32`, with the zero points taken out exactly.
//!
//! The right-hand operand is packed once into the layout the x86 VNNI instruction `vpdpbusd`
//! reads: blocks of 16 columns, each holding 4 consecutive `k` of every column in 64 bytes.
//! A plain-Rust kernel reads the same layout where VNNI is missing, and gives the same integers.

use std::ops::Range;

use super::BLOCK;

/// A right-hand operand `B` (`k × n`), packed. `u8` operands are stored shifted by 128 into
/// `i8`, as `vpdpbusd` multiplies unsigned by signed bytes.
#[derive(Debug, Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    blocks: usize,
    data: Vec<i8>,
    /// Σ_k of each column's original values.
    colsum: Vec<i32>,
    /// What was subtracted from the original values to store them (0 or 128).
    shift: i32,
    /// B's zero point in its original values.
    zero: i32,
}

impl PackedB {
    /// Packs signed weights `get(k, n)` with zero point 0. `k` must be a multiple of 4.
    pub fn weights(k: usize, n: usize, get: impl Fn(usize, usize) -> i8) -> Self {
        Self::pack(k, n, 0, 0, |r, c| {
            let v = get(r, c);
            (v, i32::from(v))
        })
    }

    /// Packs unsigned activations `get(k, n)` with zero point `zero`. `k` must be a multiple of 4.
    pub fn activations(k: usize, n: usize, zero: u8, get: impl Fn(usize, usize) -> u8) -> Self {
        Self::pack(k, n, 128, i32::from(zero), |r, c| {
            let v = get(r, c);
            ((v ^ 0x80) as i8, i32::from(v))
        })
    }

    fn pack(
        k: usize,
        n: usize,
        shift: i32,
        zero: i32,
        get: impl Fn(usize, usize) -> (i8, i32),
    ) -> Self {
        assert!(k.is_multiple_of(4), "k = {k} is not a multiple of 4");
        let blocks = n.div_ceil(BLOCK);
        let mut data = vec![0i8; blocks * k * BLOCK];
        let mut colsum = vec![0i32; n];
        for (col, sum) in colsum.iter_mut().enumerate() {
            let (block, lane) = (col / BLOCK, col % BLOCK);
            for row in 0..k {
                let (stored, original) = get(row, col);
                data[block * k * BLOCK + (row / 4) * 4 * BLOCK + lane * 4 + row % 4] = stored;
                *sum += original;
            }
        }
        Self {
            k,
            n,
            blocks,
            data,
            colsum,
            shift,
            zero,
        }
    }

    /// Rows of the operand (the shared dimension).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of the operand (of the product).
    pub fn n(&self) -> usize {
        self.n
    }
}

/// How the products are computed on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX-512 VNNI (`vpdpbusd`).
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if super::x86::vnni_available() {
            return Kernel::Vnni;
        }
        Kernel::Portable
    }
}

/// `out[m][n] = Σ_k (a[m][k] - za)(b[k][n] - zb)` for the `a.len() / b.k()` rows of `a` (row
/// stride `b.k()`); `out` holds as many rows of `b.n()`.
pub fn gemm(kernel: Kernel, a: &[u8], za: u8, b: &PackedB, out: &mut [i32]) {
    let k = b.k;
    let rows = a.len() / k;
    assert_eq!(a.len(), rows * k, "A's length is not whole rows of {k}");
    assert_eq!(out.len(), rows * b.n, "out is not {rows} rows of {}", b.n);
    let width = b.blocks * BLOCK;
    let za = i32::from(za);
    let k = k as i32;
    if width == b.n {
        // Whole blocks: the kernel writes the raw sums in place.
        run(kernel, a, b, out);
    } else {
        let mut raw = vec![0i32; rows * width];
        run(kernel, a, b, &mut raw);
        for (raw, out) in raw.chunks_exact(width).zip(out.chunks_exact_mut(b.n)) {
            out.copy_from_slice(&raw[..b.n]);
        }
    }
    for (row, out) in out.chunks_exact_mut(b.n).enumerate() {
        let rowsum = super::vector::sum_bytes(&a[row * b.k..(row + 1) * b.k]);
        let row_term = (b.shift - b.zero) * rowsum + k * za * b.zero;
        super::vector::take_out_zeros(out, row_term, za, &b.colsum);
    }
}

fn run(kernel: Kernel, a: &[u8], b: &PackedB, raw: &mut [i32]) {
    match kernel {
        Kernel::Portable => portable(a, b.k, b, raw),
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => super::x86::vnni(a, b.k, &b.data, b.blocks, raw),
    }
}

fn portable(a: &[u8], k: usize, b: &PackedB, raw: &mut [i32]) {
    let width = b.blocks * BLOCK;
    for (a_row, raw_row) in a.chunks_exact(k).zip(raw.chunks_exact_mut(width)) {
        for (block, acc) in raw_row.chunks_exact_mut(BLOCK).enumerate() {
            acc.fill(0);
            let packed = &b.data[block * k * BLOCK..(block + 1) * k * BLOCK];
            for (a4, b4) in a_row.chunks_exact(4).zip(packed.chunks_exact(4 * BLOCK)) {
                for (lane, sum) in acc.iter_mut().enumerate() {
                    let col = &b4[lane * 4..lane * 4 + 4];
                    *sum += (0..4)
                        .map(|j| i32::from(a4[j]) * i32::from(col[j]))
                        .sum::<i32>();
                }
            }
        }
    }
}

/// Splits `0..rows` into up to `threads` ranges and runs `f` on each, the first on this thread,
/// the rest on scoped threads; returns the results in row order.
pub fn split<R: Send>(threads: usize, rows: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
    let parts = threads.clamp(1, rows.max(1));
    let ranges: Vec<Range<usize>> = (0..parts)
        .map(|i| rows * i / parts..rows * (i + 1) / parts)
        .collect();
    if parts == 1 {
        return vec![f(0..rows)];
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = ranges[1..]
            .iter()
            .map(|range| {
                let range = range.clone();
                scope.spawn(move || f(range))
            })
            .collect();
        let mut results = vec![f(ranges[0].clone())];
        for handle in handles {
            match handle.join() {
                Ok(result) => results.push(result),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        results
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator: the tests need varied bytes, not randomness.
    fn bytes(seed: u32, len: usize) -> Vec<u8> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect()
    }

    fn reference(a: &[u8], za: u8, b: &[i32], zb: i32, k: usize, n: usize) -> Vec<i32> {
        let rows = a.len() / k;
        let mut out = vec![0; rows * n];
        for m in 0..rows {
            for c in 0..n {
                out[m * n + c] = (0..k)
                    .map(|i| (i32::from(a[m * k + i]) - i32::from(za)) * (b[i * n + c] - zb))
                    .sum();
            }
        }
        out
    }

    fn kernels() -> Vec<Kernel> {
        let mut all = vec![Kernel::Portable];
        if Kernel::detect() != Kernel::Portable {
            all.push(Kernel::detect());
        }
        all
    }

    #[test]
    fn products_with_signed_weights_are_exact() {
        // Odd shapes: rows and columns that fill no tile or block evenly.
        for (rows, k, n) in [(1, 4, 1), (7, 12, 17), (13, 64, 40), (9, 400, 33)] {
            let a = bytes(1, rows * k);
            let w: Vec<i8> = bytes(2, k * n).into_iter().map(|v| v as i8).collect();
            let packed = PackedB::weights(k, n, |r, c| w[r * n + c]);
            let wide: Vec<i32> = w.iter().map(|&v| i32::from(v)).collect();
            let expected = reference(&a, 3, &wide, 0, k, n);
            for kernel in kernels() {
                // Whatever the buffer held before is overwritten.
                let mut out = vec![-7; rows * n];
                gemm(kernel, &a, 3, &packed, &mut out);
                assert_eq!(out, expected, "{kernel:?} {rows}x{k}x{n}");
            }
        }
    }

    #[test]
    fn products_with_unsigned_activations_are_exact() {
        for (rows, k, n) in [(5, 8, 3), (11, 64, 400), (6, 400, 64)] {
            let a = bytes(3, rows * k);
            let b = bytes(4, k * n);
            let packed = PackedB::activations(k, n, 131, |r, c| b[r * n + c]);
            let wide: Vec<i32> = b.iter().map(|&v| i32::from(v)).collect();
            let expected = reference(&a, 250, &wide, 131, k, n);
            for kernel in kernels() {
                let mut out = vec![0; rows * n];
                gemm(kernel, &a, 250, &packed, &mut out);
                assert_eq!(out, expected, "{kernel:?} {rows}x{k}x{n}");
            }
        }
    }

    #[test]
    fn split_covers_every_row_once_in_order() {
        for (threads, rows) in [(1, 5), (2, 5), (3, 2), (4, 400)] {
            let parts = split(threads, rows, |range| range);
            let flat: Vec<usize> = parts.into_iter().flatten().collect();
            assert_eq!(flat, (0..rows).collect::<Vec<_>>());
        }
    }
}
