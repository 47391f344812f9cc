"""The BPF side: raw bpf(2) calls, BTF/kfunc patching, compile + load (bcc), attach (bpf_link or netlink)."""
