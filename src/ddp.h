/* ddp: (to be written) */
