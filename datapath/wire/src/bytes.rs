//! Big-endian field access by byte range, shared by every header view (the views'
//! `field` modules name the ranges; these read and write them).
//!
//! Callers index with ranges from their `field` modules after the view's checked
//! constructor has verified the buffer is long enough, as smoltcp's views do.

use core::ops::Range;

#[inline]
pub(crate) fn get_u16(buf: &[u8], r: Range<usize>) -> u16 {
    let b = &buf[r];
    u16::from_be_bytes([b[0], b[1]])
}

#[inline]
pub(crate) fn get_u32(buf: &[u8], r: Range<usize>) -> u32 {
    let b = &buf[r];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
pub(crate) fn set_u16(buf: &mut [u8], r: Range<usize>, v: u16) {
    buf[r].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u32(buf: &mut [u8], r: Range<usize>, v: u32) {
    buf[r].copy_from_slice(&v.to_be_bytes());
}
