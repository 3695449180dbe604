"""The .sasm grammars (Lark, LALR): sasm.lark for statements, expr.lark for expressions."""
