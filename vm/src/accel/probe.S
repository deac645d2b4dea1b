# The KVM probe guest (accel/probe.rs embeds its bytes; vm/tests/accel.rs assembles this file
# with GNU as and compares): a 64 KiB firmware image, booted with `-bios`, that goes from the
# reset vector to long mode, runs a loop of 10 million iterations, and writes 0x2a to the
# isa-debug-exit port 0xf4, which ends QEMU with status (0x2a << 1) | 1 = 85.
#
#   as --64 -o probe.o probe.S && objcopy -O binary -j .text probe.o probe.bin
#
# The image is mapped below 4 GiB and its copy at 0xF0000 (LOW); after the reset vector's far
# jump everything runs from the copy, which the page table below maps one to one.
    .set LOW, 0xF0000
    .text
    .code16
start:
    cli
    mov $0xF000, %ax
    mov %ax, %ds
    lgdtl (gdtr - start)
    mov %cr0, %eax
    or $1, %eax                     # CR0.PE: protected mode
    mov %eax, %cr0
    ljmpl $0x08, $(LOW + pm32 - start)
    .code32
pm32:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    # PML4 at 0x1000, PDPT at 0x2000, page directory at 0x3000: the first 2 MiB, one to one.
    mov $0x1000, %edi
    xor %eax, %eax
    mov $(3 * 4096 / 4), %ecx
    rep stosl
    movl $0x2003, 0x1000            # present, writable
    movl $0x3003, 0x2000
    movl $0x83, 0x3000              # present, writable, a 2 MiB page
    mov $0x1000, %eax
    mov %eax, %cr3
    mov %cr4, %eax
    or $0x20, %eax                  # CR4.PAE
    mov %eax, %cr4
    mov $0xC0000080, %ecx           # EFER
    rdmsr
    or $0x100, %eax                 # EFER.LME
    wrmsr
    mov %cr0, %eax
    or $0x80000000, %eax            # CR0.PG: long mode
    mov %eax, %cr0
    ljmp $0x18, $(LOW + lm64 - start)
    .code64
lm64:
    # A loop that hardware virtualization runs in milliseconds and TCG in tens of them, where a
    # KVM that emulates each instruction needs seconds.
    mov $10000000, %ecx
1:  dec %ecx
    jnz 1b
    mov $0x2a, %al
    out %al, $0xf4
2:  hlt
    jmp 2b
    .p2align 3
gdt:
    .quad 0
    .quad 0x00CF9B000000FFFF        # 0x08: 32-bit code, 4 GiB (accessed: the ROM is not written)
    .quad 0x00CF93000000FFFF        # 0x10: data, 4 GiB
    .quad 0x00AF9B000000FFFF        # 0x18: 64-bit code
gdtr:
    .word gdtr - gdt - 1
    .long LOW + gdt - start
    .code16
    .org 0xFFF0                     # the reset vector: 16 bytes below 4 GiB
    ljmp $0xF000, $0
    .org 0x10000
