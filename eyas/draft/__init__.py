"""The EAGLE-3 draft: model (vLLM's LlamaForCausalLMEagle3), draft vocabulary, training-time
test loss, and the checkpoint vLLM loads."""
