# The strict number parser and ZSPEED_NUM_THREADS: test_numbers once with
# the variable unset and once per value (usable ones size the default pool,
# the others must be refused, not replaced by the core count).
zs_test_binary(test_numbers)
zs_add_test(test_numbers)
set(zs_i 0)
foreach(value 3 1 abc 0 -1 100000 " 4" 4096x)
  zs_add_test(test_numbers VARIANT env${zs_i} ENV "ZSPEED_NUM_THREADS=${value}")
  math(EXPR zs_i "${zs_i} + 1")
endforeach()
