from tailtrain.cli import main

if __name__ == "__main__":  # not when a fork server or spawned rank imports it
    raise SystemExit(main())
