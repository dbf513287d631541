from rlpipe.app import main

main()
