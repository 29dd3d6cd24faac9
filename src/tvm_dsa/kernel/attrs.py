"""The names the TIR passes mark a lowered kernel with and kernel generation reads: storage scopes,
loop and block annotations, PrimFunc attributes."""

LB_SCOPE = "local.dsa_lb"  # storage scope of a core's local buffer
GB_SCOPE = "global.dsa_gb"  # storage scope of the cluster's global buffer
# PrimFunc attribute: every compute stage gets an LB copy of its own of each DDR input, not one
# copy shared by the stages reading the tensor (which holds only the box the first one reads)
COPY_EACH = "dsa.copy_each"
STRIP = "strip"  # loop annotation: the strips of a contraction's epilogue
CLAMP = "dsa.clamp"  # tile-loop annotation: (tile, extent) of a tile that does not divide its extent
DOUBLE_BUFFER = "dsa.double_buffer"  # root-block annotation: 1 two LB copies per tile buffer, 0 one
VECTOR_CONTRACTION = "dsa.vector_contraction"  # anchor annotation: 1 on the vector units, 0 the MME
