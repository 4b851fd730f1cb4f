"""The From scratch page's parts: the step-by-step attention, the rotary view, and mixers by hand."""
