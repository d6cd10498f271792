//! The AVX-512 VNNI kernel of [`super::gemm`]: `vpdpbusd` multiplies 4 unsigned bytes of A by 4
//! signed bytes of each of 16 columns of B and adds the 16 sums into `i32` lanes, 64
//! multiply-adds an instruction.
//!
//! Unsafe code, allowed here only: the intrinsics need CPU features checked at run time, and
//! their loads and stores take raw pointers. The one entry point checks every length first.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_setzero_si512,
    _mm512_storeu_si512,
};

use super::BLOCK;

/// Whether this CPU has the instructions [`vnni`] uses.
pub fn vnni_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Rows of A a tile covers: 8 rows × 2 blocks = 16 accumulators, half the register file.
const TILE_ROWS: usize = 8;
const TILE_BLOCKS: usize = 2;

/// `raw[m][block * 16 + lane] = Σ_k a[m][k] · b[k][col]` over whole blocks, `a` rows of `k`
/// bytes, `b` packed as [`super::gemm::PackedB`] lays it out.
///
/// # Panics
/// If the lengths do not agree, or the CPU lacks VNNI (checked by [`vnni_available`]).
pub fn vnni(a: &[u8], k: usize, b: &[i8], blocks: usize, raw: &mut [i32]) {
    assert!(vnni_available(), "the CPU has no AVX-512 VNNI");
    assert!(k.is_multiple_of(4) && k > 0);
    let rows = a.len() / k;
    assert_eq!(a.len(), rows * k);
    assert_eq!(b.len(), blocks * k * BLOCK);
    assert_eq!(raw.len(), rows * blocks * BLOCK);
    // SAFETY: the features are present (asserted above) and every length agrees, which is all
    // the tiles' pointer arithmetic relies on.
    unsafe { run(a, k, b, blocks, raw) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run(a: &[u8], k: usize, b: &[i8], blocks: usize, raw: &mut [i32]) {
    let rows = a.len() / k;
    let width = blocks * BLOCK;
    let mut row = 0;
    while row < rows {
        let tile_rows = (rows - row).min(TILE_ROWS);
        let mut block = 0;
        while block < blocks {
            let tile_blocks = (blocks - block).min(TILE_BLOCKS);
            // SAFETY: rows row..row + tile_rows and blocks block..block + tile_blocks are in
            // range; `a`, `b` and `raw` have the lengths `vnni` checked.
            unsafe {
                let a = a.as_ptr().add(row * k);
                let b = b.as_ptr().add(block * k * BLOCK);
                let out = raw.as_mut_ptr().add(row * width + block * BLOCK);
                macro_rules! tile {
                    ($($r:literal),*) => {
                        match (tile_rows, tile_blocks) {
                            $(($r, 2) => tile::<$r, 2>(a, k, b, out, width),
                              ($r, _) => tile::<$r, 1>(a, k, b, out, width),)*
                            _ => unreachable!("a tile has 1 to {TILE_ROWS} rows"),
                        }
                    };
                }
                tile!(1, 2, 3, 4, 5, 6, 7, 8);
            }
            block += tile_blocks;
        }
        row += tile_rows;
    }
}

/// One tile: `R` rows of A against `B` blocks of 16 columns, over all of `k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile<const R: usize, const B: usize>(
    a: *const u8,
    k: usize,
    b: *const i8,
    out: *mut i32,
    width: usize,
) {
    let mut acc = [[_mm512_setzero_si512(); B]; R];
    for step in 0..k / 4 {
        let mut cols = [_mm512_setzero_si512(); B];
        for (j, col) in cols.iter_mut().enumerate() {
            // SAFETY: block j of the tile holds k * 16 bytes; step * 64 + 64 <= k * 16.
            *col =
                unsafe { _mm512_loadu_si512(b.add(j * k * BLOCK + step * 64).cast::<__m512i>()) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row r holds k bytes; step * 4 + 4 <= k.
            let four = unsafe { a.add(r * k + step * 4).cast::<i32>().read_unaligned() };
            let four = _mm512_set1_epi32(four);
            for (acc, col) in acc.iter_mut().zip(&cols) {
                *acc = _mm512_dpbusd_epi32(*acc, four, *col);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            // SAFETY: row r of the tile's output holds `width` lanes from `out`, and block j
            // of the tile lies within them.
            unsafe { _mm512_storeu_si512(out.add(r * width + j * BLOCK).cast::<__m512i>(), *acc) };
        }
    }
}
