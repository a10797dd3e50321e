"""Applies the tests' CPU ISA emulation at start-up in every Python process the tests start (see gatehead_cpu_isa)."""

import gatehead_cpu_isa

gatehead_cpu_isa.apply()
