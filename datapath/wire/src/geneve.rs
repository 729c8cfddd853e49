//! Geneve (RFC 8926) headers, option TLVs, and the Oxide option class the reference
//! datapath uses (External, Multicast, Mss).
//!
//! ```text
//!  0                   1                   2                   3
//! |Ver|  Opt Len  |O|C|    Rsvd.  |          Protocol Type        |
//! |        Virtual Network Identifier (VNI)       |    Reserved   |
//! |                    Variable-Length Options                    |
//! option: | Option Class (16) | C|Type (8) | R R R| Length (5) | data (4*Length) |
//! ```

use crate::ethernet::ethertype;
use crate::{Result, WireError};
use core::fmt;

/// IANA UDP port for Geneve.
pub const GENEVE_PORT: u16 = 6081;
/// Option class assigned to Oxide Computer Company.
pub const OXIDE_OPTION_CLASS: u16 = 0x0129;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 8;
/// Length of an option header (class, type, length).
pub const OPTION_HEADER_LEN: usize = 4;
/// Longest options area: the 6-bit length field counts 4-byte words.
pub const MAX_OPTIONS_LEN: usize = 63 * 4;
/// Largest VNI (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// Bytes the Oxide Mss option takes (4-byte option header + 4-byte body).
pub const MSS_OPTION_LEN: usize = OPTION_HEADER_LEN + 4;
/// Encapsulation overhead without options: outer Ethernet 14 + IPv6 40 + UDP 8 +
/// Geneve 8 = 70 bytes.
pub const ENCAP_LEN: usize =
    crate::ethernet::HEADER_LEN + crate::ipv6::HEADER_LEN + crate::udp::HEADER_LEN + HEADER_LEN;
/// Encapsulation overhead with the Mss option (what tunneled TSO segments carry): 78.
/// Also the MTU budget of the overlay: the underlay MTU limits the outer IP packet
/// (IPv6 40 + UDP 8 + Geneve 8 + Mss 8 + inner Ethernet 14 = 78 on top of the guest's
/// IP packet), so a port MTU may be at most underlay MTU - 78. The one definition of
/// these numbers; the engine uses it for both.
pub const ENCAP_LEN_WITH_MSS: usize = ENCAP_LEN + MSS_OPTION_LEN;

/// Replication mode of the Oxide Multicast option (top 2 bits of its body). Defined
/// with the option it belongs to; `meta` only carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    External,
    Underlay,
    Both,
}

/// Oxide option types (class [`OXIDE_OPTION_CLASS`]); all are non-critical.
pub mod oxide_type {
    pub const EXTERNAL: u8 = 0x00;
    pub const MULTICAST: u8 = 0x01;
    pub const MSS: u8 = 0x02;
}

/// The critical bit of an option's type byte.
pub const OPTION_CRITICAL: u8 = 0x80;

mod field {
    use core::ops::Range;
    pub const VER_OPTLEN: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PROTOCOL: Range<usize> = 2..4;
    pub const VNI: Range<usize> = 4..7;
    pub const RESERVED: usize = 7;
}

const FLAG_OAM: u8 = 0x80;
const FLAG_CRITICAL: u8 = 0x40;

/// A view of a Geneve header and its payload.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that the header and its options fit. The version
    /// is not checked here (receivers decide what to do with other versions).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || HEADER_LEN + self.options_len() > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_OPTLEN] >> 6
    }

    /// Length of the options in bytes.
    pub fn options_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_OPTLEN] & 0x3f) as usize) * 4
    }

    /// Header length with options.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options_len()
    }

    /// O bit: a control (OAM) packet rather than data.
    pub fn oam(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_OAM != 0
    }

    /// C bit: at least one critical option is present.
    pub fn critical(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_CRITICAL != 0
    }

    pub fn protocol_type(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PROTOCOL];
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn vni(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VNI];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }

    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    pub fn option_iter(&self) -> OptionIter<'_> {
        OptionIter::new(self.options())
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes version 0 and the options length (bytes, a multiple of 4, at most
    /// [`MAX_OPTIONS_LEN`]).
    pub fn set_version0_and_options_len(&mut self, options_len: usize) {
        self.buffer.as_mut()[field::VER_OPTLEN] = ((options_len / 4) as u8) & 0x3f;
    }

    pub fn set_flags(&mut self, oam: bool, critical: bool) {
        let mut f = 0;
        if oam {
            f |= FLAG_OAM;
        }
        if critical {
            f |= FLAG_CRITICAL;
        }
        self.buffer.as_mut()[field::FLAGS] = f;
    }

    pub fn set_protocol_type(&mut self, v: u16) {
        self.buffer.as_mut()[field::PROTOCOL].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the 24-bit VNI and clears the reserved byte after it.
    pub fn set_vni(&mut self, vni: u32) {
        let b = vni.to_be_bytes();
        let buf = self.buffer.as_mut();
        buf[field::VNI].copy_from_slice(&b[1..]);
        buf[field::RESERVED] = 0;
    }

    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[HEADER_LEN..hl]
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }
}

/// One option TLV as found on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GeneveOption<'a> {
    pub class: u16,
    /// The type byte including the critical bit.
    pub type_byte: u8,
    pub data: &'a [u8],
}

impl GeneveOption<'_> {
    /// The type without the critical bit.
    pub fn option_type(&self) -> u8 {
        self.type_byte & !OPTION_CRITICAL
    }

    pub fn is_critical(&self) -> bool {
        self.type_byte & OPTION_CRITICAL != 0
    }

    /// Bytes the option takes (header + data).
    pub fn wire_len(&self) -> usize {
        OPTION_HEADER_LEN + self.data.len()
    }
}

/// Iterator over option TLVs. Yields an error (and then stops) when an option header
/// or its data runs past the options area.
pub struct OptionIter<'a> {
    rest: &'a [u8],
}

impl<'a> OptionIter<'a> {
    pub fn new(options: &'a [u8]) -> OptionIter<'a> {
        OptionIter { rest: options }
    }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<GeneveOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = read_option(self.rest);
        match r {
            Ok((opt, rest)) => {
                self.rest = rest;
                Some(Ok(opt))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Splits one option off the front of `b`.
#[inline]
pub(crate) fn read_option(b: &[u8]) -> Result<(GeneveOption<'_>, &[u8])> {
    let h = b.get(..OPTION_HEADER_LEN).ok_or(WireError::Malformed(
        "geneve option header past the options",
    ))?;
    let data_len = ((h[3] & 0x1f) as usize) * 4;
    let end = OPTION_HEADER_LEN + data_len;
    let data = b
        .get(OPTION_HEADER_LEN..end)
        .ok_or(WireError::Malformed("geneve option data past the options"))?;
    Ok((
        GeneveOption {
            class: u16::from_be_bytes([h[0], h[1]]),
            type_byte: h[2],
            data,
        },
        &b[end..],
    ))
}

/// The Oxide options (class 0x0129).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OxideOption {
    /// Traffic that entered the rack through the boundary switch. No body.
    External,
    /// Multicast replication mode: top 2 bits of a 4-byte body.
    Multicast(Replication),
    /// The sending guest's TCP MSS for a segmented (TSO) buffer: big-endian u32 body.
    Mss(u32),
}

/// Why an Oxide option could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OxideOptionError {
    /// Body length wrong for the type.
    BadLength,
    /// Multicast replication value 3 (reserved).
    BadReplication,
    /// A type this code does not know; the caller drops it only if it is critical.
    UnknownType(u8),
}

impl OxideOption {
    /// Decodes an option of class [`OXIDE_OPTION_CLASS`] (the caller checks the class).
    #[inline]
    pub fn decode(opt: &GeneveOption<'_>) -> core::result::Result<OxideOption, OxideOptionError> {
        match (opt.option_type(), opt.data.len()) {
            (oxide_type::EXTERNAL, 0) => Ok(OxideOption::External),
            (oxide_type::MULTICAST, 4) => match opt.data[0] >> 6 {
                0 => Ok(OxideOption::Multicast(Replication::External)),
                1 => Ok(OxideOption::Multicast(Replication::Underlay)),
                2 => Ok(OxideOption::Multicast(Replication::Both)),
                _ => Err(OxideOptionError::BadReplication),
            },
            (oxide_type::MSS, 4) => Ok(OxideOption::Mss(u32::from_be_bytes([
                opt.data[0],
                opt.data[1],
                opt.data[2],
                opt.data[3],
            ]))),
            (oxide_type::EXTERNAL | oxide_type::MULTICAST | oxide_type::MSS, _) => {
                Err(OxideOptionError::BadLength)
            }
            (t, _) => Err(OxideOptionError::UnknownType(t)),
        }
    }

    /// Bytes the option takes on the wire (header + body).
    pub const fn buffer_len(&self) -> usize {
        match self {
            OxideOption::External => OPTION_HEADER_LEN,
            OxideOption::Multicast(_) | OxideOption::Mss(_) => OPTION_HEADER_LEN + 4,
        }
    }

    /// Writes the option (non-critical) at the start of `buf`; returns its length.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        let b = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        let (ty, body) = match *self {
            OxideOption::External => (oxide_type::EXTERNAL, None),
            OxideOption::Multicast(r) => {
                let bits: u32 = match r {
                    Replication::External => 0,
                    Replication::Underlay => 1,
                    Replication::Both => 2,
                };
                (oxide_type::MULTICAST, Some(bits << 30))
            }
            OxideOption::Mss(m) => (oxide_type::MSS, Some(m)),
        };
        b[..2].copy_from_slice(&OXIDE_OPTION_CLASS.to_be_bytes());
        b[2] = ty;
        b[3] = ((len - OPTION_HEADER_LEN) / 4) as u8;
        if let Some(v) = body {
            b[4..8].copy_from_slice(&v.to_be_bytes());
        }
        Ok(len)
    }
}

/// A Geneve header carrying an Ethernet payload and Oxide options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub vni: u32,
    pub oam: bool,
    pub external: bool,
    pub multicast: Option<Replication>,
    pub mss: Option<u32>,
}

impl Repr {
    /// Reads a version-0 header with an Ethernet payload. Oxide options are decoded;
    /// other non-critical options are ignored and unknown critical ones refused.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.version() != 0 {
            return Err(WireError::Unsupported("geneve version"));
        }
        if p.protocol_type() != ethertype::TRANSPARENT_ETHERNET {
            return Err(WireError::Unsupported("geneve protocol type"));
        }
        let mut r = Repr {
            vni: p.vni(),
            oam: p.oam(),
            external: false,
            multicast: None,
            mss: None,
        };
        for opt in p.option_iter() {
            let opt = opt?;
            if opt.class != OXIDE_OPTION_CLASS {
                if opt.is_critical() {
                    return Err(WireError::Unsupported("geneve critical option"));
                }
                continue;
            }
            match OxideOption::decode(&opt) {
                Ok(OxideOption::External) => r.external = true,
                Ok(OxideOption::Multicast(m)) => r.multicast = Some(m),
                Ok(OxideOption::Mss(m)) => r.mss = Some(m),
                Err(OxideOptionError::BadLength) => {
                    return Err(WireError::Malformed("geneve oxide option length"))
                }
                Err(OxideOptionError::BadReplication) => {
                    return Err(WireError::Malformed("geneve multicast replication"))
                }
                Err(OxideOptionError::UnknownType(_)) if opt.is_critical() => {
                    return Err(WireError::Unsupported("geneve critical option"))
                }
                Err(OxideOptionError::UnknownType(_)) => {}
            }
        }
        Ok(r)
    }

    /// Header length with the options this header carries.
    pub const fn buffer_len(&self) -> usize {
        let mut n = HEADER_LEN;
        if self.external {
            n += OxideOption::External.buffer_len();
        }
        if self.multicast.is_some() {
            n += OPTION_HEADER_LEN + 4;
        }
        if self.mss.is_some() {
            n += OPTION_HEADER_LEN + 4;
        }
        n
    }

    /// Writes the header and options (External, Multicast, Mss in that order) at the
    /// start of `buf` and returns the header length. Allocation-free: this is what
    /// encapsulation calls per packet (or once per flow for its template).
    #[inline]
    pub fn emit_into(&self, buf: &mut [u8]) -> Result<usize> {
        if self.vni > MAX_VNI {
            return Err(WireError::Malformed("geneve vni over 24 bits"));
        }
        let hl = self.buffer_len();
        let b = buf.get_mut(..hl).ok_or(WireError::Truncated)?;
        b[0] = (((hl - HEADER_LEN) / 4) as u8) & 0x3f;
        b[1] = if self.oam { FLAG_OAM } else { 0 };
        b[2..4].copy_from_slice(&ethertype::TRANSPARENT_ETHERNET.to_be_bytes());
        b[4..7].copy_from_slice(&self.vni.to_be_bytes()[1..]);
        b[7] = 0;
        let mut at = HEADER_LEN;
        if self.external {
            at += OxideOption::External.emit(&mut b[at..])?;
        }
        if let Some(m) = self.multicast {
            at += OxideOption::Multicast(m).emit(&mut b[at..])?;
        }
        if let Some(m) = self.mss {
            at += OxideOption::Mss(m).emit(&mut b[at..])?;
        }
        debug_assert_eq!(at, hl);
        Ok(hl)
    }

    /// smoltcp-shaped emit into a view (the buffer must hold `buffer_len()` bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        self.emit_into(p.buffer.as_mut()).map(|_| ())
    }
}

/// Writes a data-plane Geneve header (version 0, Ethernet payload, O=C=0) with `vni`
/// and, when given, the Oxide Mss option; returns the header length (8, or 16 with
/// Mss). The encapsulation fast path calls this.
#[inline]
pub fn emit_header(buf: &mut [u8], vni: u32, mss: Option<u32>) -> Result<usize> {
    Repr {
        vni,
        oam: false,
        external: false,
        multicast: None,
        mss,
    }
    .emit_into(buf)
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Geneve vni={}", self.vni)?;
        if self.oam {
            write!(f, " oam")?;
        }
        if self.external {
            write!(f, " external")?;
        }
        if let Some(m) = self.multicast {
            write!(f, " multicast={m:?}")?;
        }
        if let Some(m) = self.mss {
            write!(f, " mss={m}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // VNI 0x123456, Mss option 8870 (0x22a6): opt len 2 words.
    static MSS_HEADER: [u8; 16] = [
        0x02, 0x00, 0x65, 0x58, 0x12, 0x34, 0x56, 0x00, 0x01, 0x29, 0x02, 0x01, 0x00, 0x00, 0x22,
        0xa6,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&MSS_HEADER[..]).unwrap();
        assert_eq!(p.version(), 0);
        assert_eq!(p.options_len(), 8);
        assert_eq!(p.header_len(), 16);
        assert!(!p.oam() && !p.critical());
        assert_eq!(p.protocol_type(), 0x6558);
        assert_eq!(p.vni(), 0x123456);
        let opts: Vec<_> = p.option_iter().collect();
        assert_eq!(
            opts,
            vec![Ok(GeneveOption {
                class: OXIDE_OPTION_CLASS,
                type_byte: oxide_type::MSS,
                data: &[0, 0, 0x22, 0xa6]
            })]
        );
        assert!(p.payload().is_empty());
    }

    #[test]
    fn overheads_match_the_reference() {
        // opte-facts: 70 bytes of encapsulation, 78 with the Mss option; an IPv4+TCP
        // guest with timestamps on a 9000-byte underlay gets mss 9000 - 78 - 52 = 8870.
        assert_eq!(ENCAP_LEN, 70);
        assert_eq!(ENCAP_LEN_WITH_MSS, 78);
        let mut buf = [0u8; 16];
        assert_eq!(
            emit_header(&mut buf, 1, Some(1)),
            Ok(HEADER_LEN + MSS_OPTION_LEN)
        );
    }

    #[test]
    fn emit_header_fast_path() {
        let mut buf = [0xffu8; 32];
        assert_eq!(emit_header(&mut buf, 0x123456, Some(8870)), Ok(16));
        assert_eq!(buf[..16], MSS_HEADER);
        assert_eq!(emit_header(&mut buf, 0x123456, None), Ok(8));
        assert_eq!(buf[..8], [0, 0, 0x65, 0x58, 0x12, 0x34, 0x56, 0]);
        assert_eq!(
            emit_header(&mut buf, 0x0100_0000, None),
            Err(WireError::Malformed("geneve vni over 24 bits"))
        );
        assert_eq!(
            emit_header(&mut buf[..15], 1, Some(1)),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn round_trip_all_options() {
        for repl in [
            Replication::External,
            Replication::Underlay,
            Replication::Both,
        ] {
            let repr = Repr {
                vni: 7777,
                oam: false,
                external: true,
                multicast: Some(repl),
                mss: Some(1448),
            };
            let mut buf = [0u8; 28];
            let n = repr.emit_into(&mut buf).unwrap();
            assert_eq!(n, 28);
            assert_eq!(n, repr.buffer_len());
            let p = Packet::new_checked(&buf[..]).unwrap();
            assert_eq!(Repr::parse(&p), Ok(repr));
        }
    }

    #[test]
    fn parse_refusals_and_ignores() {
        // Unknown non-critical option of another class: ignored.
        let mut b = vec![0x01, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x01, 0x05, 0x00];
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.vni, r.mss, r.external), (1, None, false));
        // Same option with the critical bit: refused.
        b[10] = 0x85;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Unsupported("geneve critical option"))
        );
        // Unknown Oxide type, critical: refused; non-critical: ignored.
        let mut b = vec![0x01, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x29, 0x83, 0x00];
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Unsupported("geneve critical option"))
        );
        b[10] = 0x03;
        assert!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()).is_ok());
        // Mss option with no body.
        b[10] = oxide_type::MSS;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Malformed("geneve oxide option length"))
        );
        // Multicast replication 3.
        let b = [
            0x02, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x29, 0x01, 0x01, 0xc0, 0, 0, 0,
        ];
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Malformed("geneve multicast replication"))
        );
        // Option data running past the options area.
        let b = [0x01, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x29, 0x02, 0x01];
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Malformed("geneve option data past the options"))
        );
        // Options length beyond the buffer.
        assert_eq!(
            Packet::new_checked(&b[..11]).unwrap_err(),
            WireError::Truncated
        );
        // Wrong version and protocol.
        let mut b = [0u8, 0, 0x65, 0x58, 0, 0, 1, 0];
        b[0] = 0x40;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Unsupported("geneve version"))
        );
        b[0] = 0;
        b[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Unsupported("geneve protocol type"))
        );
    }

    #[test]
    fn view_setters() {
        let mut b = [0xffu8; 16];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_version0_and_options_len(8);
        p.set_flags(false, false);
        p.set_protocol_type(0x6558);
        p.set_vni(0x123456);
        OxideOption::Mss(8870).emit(p.options_mut()).unwrap();
        assert_eq!(b, MSS_HEADER);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap())
                .unwrap()
                .to_string(),
            "Geneve vni=1193046 mss=8870"
        );
    }
}
