//! Mutual TLS for the cluster link (filled in next).
