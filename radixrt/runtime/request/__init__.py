"""The request subsystem: the frozen RequestOptions, sampling parameters and their checks, stop
rules, the request edge (checks, n-expansion), results and incremental detokenisation."""
