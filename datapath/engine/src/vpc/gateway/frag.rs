//! IPv4 fragmentation (RFC 791 §3.2) of guest packets without DF that exceed their
//! path MTU. Rare (guests do path-MTU discovery), so this favours clarity: each
//! fragment is written whole into the batch.

use crate::drop::DropReason;
use crate::frames::output::{TxBatch, TxDest};
use wire::checksum;
use wire::meta::{InnerMeta, L3};

/// Smallest MTU every IPv4 link carries (RFC 791): below it fragmentation is refused.
const MIN_IPV4_MTU: u16 = 68;

/// Splits the IPv4 packet of `frame` into fragments that fit `path_mtu`, each sent to
/// `dest` with the frame's own Ethernet header (tags included). Options are copied
/// into every fragment only when their copy flag is set. A packet that is already a
/// fragment is split further with offsets relative to the original datagram. Returns
/// the number of fragments, or why it could not: `DropReason::NotIpv4`, `DropReason::DontFragment`,
/// `DropReason::MtuBelow68`, `DropReason::MalformedIpv4`, `DropReason::MalformedIpv4Options`.
pub fn fragment_ipv4(
    meta: &InnerMeta,
    frame: &[u8],
    path_mtu: u16,
    dest: TxDest,
    out: &mut TxBatch,
) -> Result<usize, DropReason> {
    if meta.l3 != L3::Ipv4 {
        return Err(DropReason::NotIpv4);
    }
    if meta.dont_fragment {
        return Err(DropReason::DontFragment);
    }
    if path_mtu < MIN_IPV4_MTU {
        return Err(DropReason::MtuBelow68);
    }
    let l2 = frame.get(..meta.l3_off).ok_or(DropReason::MalformedIpv4)?;
    let ip = frame
        .get(meta.l3_off..meta.ip_end)
        .ok_or(DropReason::MalformedIpv4)?;
    let ihl = usize::from(ip.first().ok_or(DropReason::MalformedIpv4)? & 0x0f) * 4;
    if ihl < 20 || ip.len() < ihl {
        return Err(DropReason::MalformedIpv4);
    }
    let header = &ip[..ihl];
    let payload = &ip[ihl..];
    let mtu = usize::from(path_mtu);
    if ip.len() <= mtu {
        // Fits already: one "fragment", the packet itself.
        out.push(dest, meta.ip_end)
            .copy_from_slice(&frame[..meta.ip_end]);
        return Ok(1);
    }
    let mut copied = [0u8; 40];
    let copied_len = copied_options(&header[20..], &mut copied)?;
    let orig_flags_off = u16::from_be_bytes([header[6], header[7]]);
    let orig_mf = orig_flags_off & 0x2000 != 0;
    let orig_off_units = usize::from(orig_flags_off & 0x1fff);

    let mut count = 0;
    let mut at = 0;
    while at < payload.len() {
        let hlen = if count == 0 { ihl } else { 20 + copied_len };
        // Fragment data must be a multiple of 8 bytes except in the last fragment.
        let room = (mtu - hlen) / 8 * 8;
        if room == 0 {
            return Err(DropReason::MtuBelow68);
        }
        let len = room.min(payload.len() - at);
        let last = at + len == payload.len();
        let buf = out.push(dest, l2.len() + hlen + len);
        buf[..l2.len()].copy_from_slice(l2);
        let h = &mut buf[l2.len()..];
        if count == 0 {
            h[..ihl].copy_from_slice(header);
        } else {
            h[..20].copy_from_slice(&header[..20]);
            h[20..hlen].copy_from_slice(&copied[..copied_len]);
            h[0] = 0x40 | (hlen / 4) as u8;
        }
        h[2..4].copy_from_slice(&((hlen + len) as u16).to_be_bytes());
        let mf = !last || orig_mf;
        let off_units = orig_off_units + at / 8;
        let flags_off = (if mf { 0x2000 } else { 0 }) | (off_units as u16 & 0x1fff);
        h[6..8].copy_from_slice(&flags_off.to_be_bytes());
        h[10..12].fill(0);
        let c = checksum::checksum(&h[..hlen]);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h[hlen..hlen + len].copy_from_slice(&payload[at..at + len]);
        at += len;
        count += 1;
    }
    Ok(count)
}

/// Copies the options whose copy flag (bit 7 of the type) is set into `dst`, padded
/// with End-of-Options to a multiple of 4; returns the padded length.
fn copied_options(opts: &[u8], dst: &mut [u8; 40]) -> Result<usize, DropReason> {
    let mut i = 0;
    let mut n = 0;
    while i < opts.len() {
        let t = opts[i];
        match t {
            0 => break,
            1 => i += 1,
            _ => {
                let len = usize::from(*opts.get(i + 1).ok_or(DropReason::MalformedIpv4Options)?);
                if len < 2 || i + len > opts.len() {
                    return Err(DropReason::MalformedIpv4Options);
                }
                if t & 0x80 != 0 {
                    dst[n..n + len].copy_from_slice(&opts[i..i + len]);
                    n += len;
                }
                i += len;
            }
        }
    }
    let padded = n.div_ceil(4) * 4;
    dst[n..padded].fill(0);
    Ok(padded)
}
