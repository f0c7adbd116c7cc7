from speculators_compat.cli import main

if __name__ == "__main__":
    main(prog_name="python -m speculators_compat")
