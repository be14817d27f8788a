//! `idemrelay sink`: the test upstream.
