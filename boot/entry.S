/*
 * Magpie PVH entry.
 *
 * QEMU (`-kernel magpie.elf`) finds the XEN_ELFNOTE_PHYS32_ENTRY note and
 * jumps to `_start32` in 32-bit protected mode, paging off, with %ebx = the
 * physical address of `struct hvm_start_info`.
 *
 * We zero .bss, build boot page tables, enter long mode and call the Rust
 * `kernel_entry(start_info_phys)` on the boot stack in the higher half.
 *
 * Boot page tables (replaced by kernel/src/mm/paging.rs once the frame
 * allocator is up), all with 2 MiB pages:
 *   0x0000_0000_0000_0000 + [0, 4 GiB)  identity (this code runs there)
 *   0xffff_8000_0000_0000 + [0, 4 GiB)  direct map (same PDPT)
 *   0xffff_ffff_8000_0000 + [0, 1 GiB)  kernel image (code-model=kernel)
 */

/* ---- PVH note: type 18, name "Xen", 64-bit physical entry point. ---- */
.section .note.pvh, "a", @note
.balign 4
.long 4                 /* n_namesz */
.long 8                 /* n_descsz */
.long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
.asciz "Xen"
.balign 4
.quad _start32
.balign 4

.section .boot.text, "ax", @progbits
.code32
.global _start32
_start32:
    cli
    cld
    mov %ebx, %esi                      /* keep hvm_start_info in %esi */

    /* Zero .bss (includes the boot stack and the bootstrap heap). */
    mov $__bss_start_phys, %edi
    mov $__bss_end_phys, %ecx
    sub %edi, %ecx
    shr $2, %ecx
    xor %eax, %eax
    rep stosl

    /* Zero the boot page tables. */
    mov $boot_page_tables, %edi
    mov $(7 * 4096 / 4), %ecx
    rep stosl

    /* PML4[0] and PML4[256] -> low PDPT; PML4[511] -> high PDPT. */
    mov $(boot_pdpt_low + 3), %eax
    mov %eax, boot_pml4
    mov %eax, boot_pml4 + 256 * 8
    mov $(boot_pdpt_high + 3), %eax
    mov %eax, boot_pml4 + 511 * 8

    /* Low PDPT[0..4] -> the four PDs; high PDPT[510] -> PD 0. */
    mov $(boot_pd + 3), %eax
    mov %eax, boot_pdpt_low
    mov %eax, boot_pdpt_high + 510 * 8
    add $4096, %eax
    mov %eax, boot_pdpt_low + 8
    add $4096, %eax
    mov %eax, boot_pdpt_low + 16
    add $4096, %eax
    mov %eax, boot_pdpt_low + 24

    /* 2048 x 2 MiB pages: present | writable | page size. */
    mov $boot_pd, %edi
    mov $0x83, %eax
    xor %edx, %edx
    mov $2048, %ecx
1:  mov %eax, (%edi)
    mov %edx, 4(%edi)
    add $0x200000, %eax
    adc $0, %edx
    add $8, %edi
    loop 1b

    /* CR4.PAE */
    mov %cr4, %eax
    or $0x20, %eax
    mov %eax, %cr4

    mov $boot_pml4, %eax
    mov %eax, %cr3

    /* EFER.LME, plus EFER.NXE when the CPU has NX (CPUID 0x80000001 EDX[20]). */
    mov $0x80000001, %eax
    cpuid
    mov %edx, %ebp
    mov $0xC0000080, %ecx
    rdmsr
    or $0x100, %eax
    test $(1 << 20), %ebp
    jz 2f
    or $0x800, %eax
2:  wrmsr

    /* CR0: PG | WP | PE */
    mov %cr0, %eax
    or $0x80010001, %eax
    mov %eax, %cr0

    lgdt boot_gdt_pointer
    ljmp $0x08, $long_mode_entry

.code64
long_mode_entry:
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    xor %eax, %eax
    mov %eax, %fs
    mov %eax, %gs

    movabs $__boot_stack_top, %rsp
    xor %ebp, %ebp                      /* terminates frame-pointer walks */
    mov %esi, %edi                      /* arg 0: hvm_start_info (phys) */
    movabs $kernel_entry, %rax
    call *%rax
3:  cli
    hlt
    jmp 3b

.section .boot.data, "aw", @progbits
.balign 8
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: 64-bit kernel code */
    .quad 0x00cf92000000ffff            /* 0x10: kernel data */
boot_gdt_end:
boot_gdt_pointer:
    .word boot_gdt_end - boot_gdt - 1
    .long boot_gdt

.section .boot.bss, "aw", @nobits
.balign 4096
boot_page_tables:
boot_pml4:      .skip 4096
boot_pdpt_low:  .skip 4096
boot_pdpt_high: .skip 4096
boot_pd:        .skip 4 * 4096
