//! mesh-ops: the operator's tooling for a mesh cluster (status, certificates).
