from rljax.console import main

main()
