/*
 * Magpie application-processor trampoline.
 *
 * Assembled into the kernel image as data (.rodata) and copied by
 * kernel/src/arch/ap.rs to physical AP_TRAMPOLINE_PHYS (0x8000) before the
 * boot CPU sends INIT-SIPI-SIPI with vector 0x08. The AP starts here in
 * real mode at CS:IP = 0x0800:0000 and goes
 *
 *   real mode -> 32-bit protected mode (trampoline GDT, paging off)
 *             -> long mode on the trampoline page tables: PML4[0] maps the
 *                low 2 MiB identity (this code), PML4[256..512] are the
 *                kernel's own entries (direct map, MMIO, kernel image)
 *             -> jumps to the Rust entry in the higher half with the stack
 *                and argument from the slots below; Rust loads the
 *                kernel's CR3 first thing.
 *
 * The boot CPU fills the slots (offsets fixed: ap.rs writes them) and
 * starts one AP at a time, so one copy of the trampoline serves all.
 * Everything here is position-dependent on AP_TRAMPOLINE_PHYS.
 */

.set AP_TRAMPOLINE_PHYS, 0x8000

.pushsection .rodata.ap_trampoline, "a", @progbits
.balign 16
.global ap_trampoline_start
.global ap_trampoline_end

.code16
ap_trampoline_start:
    .byte 0xeb, ap_real_mode - ap_trampoline_start - 2     /* jmp short ap_real_mode */
    .skip 6

/* ---- Slots at fixed offsets, filled by the boot CPU (ap.rs: SLOT_*). ---- */
ap_slot_cr3:    .quad 0     /* +8:  trampoline PML4 (physical, < 4 GiB) */
ap_slot_stack:  .quad 0     /* +16: stack top (16-byte aligned, higher half) */
ap_slot_entry:  .quad 0     /* +24: extern "C" fn(arg: u64) -> ! */
ap_slot_arg:    .quad 0     /* +32: its argument */
ap_slot_efer:   .quad 0     /* +40: EFER bits to set (LME, and NXE if the BSP has it) */

.balign 8
ap_gdt:
    .quad 0
    .quad 0x00cf9a000000ffff            /* 0x08: 32-bit code */
    .quad 0x00cf92000000ffff            /* 0x10: data */
    .quad 0x00af9a000000ffff            /* 0x18: 64-bit code */
ap_gdt_end:
ap_gdt_pointer:
    .word ap_gdt_end - ap_gdt - 1
    .long AP_TRAMPOLINE_PHYS + (ap_gdt - ap_trampoline_start)

ap_real_mode:
    cli
    cld
    mov %cs, %ax
    mov %ax, %ds
    lgdtl (ap_gdt_pointer - ap_trampoline_start)
    mov %cr0, %eax
    or $1, %eax                         /* CR0.PE */
    mov %eax, %cr0
    ljmpl $0x08, $(AP_TRAMPOLINE_PHYS + (ap_protected_mode - ap_trampoline_start))

.code32
ap_protected_mode:
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    xor %eax, %eax
    mov %eax, %fs
    mov %eax, %gs

    mov %cr4, %eax
    or $0x20, %eax                      /* CR4.PAE */
    mov %eax, %cr4

    mov (AP_TRAMPOLINE_PHYS + 8), %eax
    mov %eax, %cr3

    mov $0xC0000080, %ecx               /* EFER */
    rdmsr
    or (AP_TRAMPOLINE_PHYS + 40), %eax
    wrmsr

    mov %cr0, %eax
    or $0x80010001, %eax                /* CR0: PG | WP | PE */
    mov %eax, %cr0

    ljmp $0x18, $(AP_TRAMPOLINE_PHYS + (ap_long_mode - ap_trampoline_start))

.code64
ap_long_mode:
    mov (AP_TRAMPOLINE_PHYS + 16), %rsp
    mov (AP_TRAMPOLINE_PHYS + 32), %rdi
    mov (AP_TRAMPOLINE_PHYS + 24), %rax
    xor %ebp, %ebp                      /* terminates frame-pointer walks */
    push $0                             /* no return address: entry alignment as after a call */
    jmp *%rax

ap_trampoline_end:
.popsection
