//! Tunneled TSO: segmenting guest GSO buffers for the underlay, and coalescing received segments.
