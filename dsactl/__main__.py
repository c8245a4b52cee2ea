from dsactl.cli import main

main()
