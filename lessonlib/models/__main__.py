"""``python -m lessonlib.models``: the parameter count of the default shapes."""
from lessonlib.models.tiny import GPTConfig, TinyGPT, count_parameters, mlp_stack

print(f"TinyGPT{GPTConfig()}: {count_parameters(TinyGPT()):,} parameters")
print(f"mlp_stack(64, 4): {count_parameters(mlp_stack()):,} parameters")
