# The strict number parser.
zs_test_binary(test_numbers)
zs_add_test(test_numbers)
