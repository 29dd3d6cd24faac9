"""TVM's bring-your-own-codegen flow for the DSA: patterns registered under the prefix ``dsa.``
(``patterns``) and the ``relax.ext.dsa`` codegen (``codegen``), so that
``FuseOpsByPattern(get_patterns_with_prefix("dsa"), annotate_codegen=True)`` then ``RunCodegen()``
offloads the kernels the ``dsa`` pipeline would, as for cutlass or cublas (docs/architecture.md)."""
