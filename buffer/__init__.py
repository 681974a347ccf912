"""Data contracts, prefix expansion and packing, the staleness-filtered ring buffer."""
