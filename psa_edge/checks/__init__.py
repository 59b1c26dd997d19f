"""Everything compared with the float reference, as one layer over the backends and the runtime:
the shared tolerances, chunk-feeding helper and reference (`reference`), the export-time parity
gate (`parity`), `psa-edge verify` (`verify`) and `psa-edge quant-check` (`quant_check`).
torch is imported only where the eager reference is built.
"""
