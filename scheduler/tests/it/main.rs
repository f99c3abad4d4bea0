//! Device choice on recorded `nvidia-smi topo -m` layouts, and properties of placement.

mod properties;
mod topologies;
