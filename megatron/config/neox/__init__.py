"""GPT-NeoX's vocabulary beyond our own keys: every GPT-NeoX key we do not implement, classified
(`keys.py::NEOX_KEYS`), and what resolution does with each class (`policy.py`: accepted at its
default, warned about when it cannot change the result, refused otherwise).
"""
