//! The virtual gateway: what the datapath answers for the guest itself.
